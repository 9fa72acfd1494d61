#!/usr/bin/env python3
# bench/serve_first_probe.py — usage: python3 bench/serve_first_probe.py ./kiln MODEL.gguf cpu|cuda (run from the repo root)
# first vs later requests of a fresh kiln serve: client TTFT and the server's own timings (queue, prompt, ttft)
import json, sys, time, http.client, statistics, random
sys.path.insert(0, "bench")
import serve_bench as sb
kiln, model, dev = sys.argv[1], sys.argv[2], sys.argv[3]
for run in range(3):
    srv = sb.Server("kiln", kiln, model, 4, 1, 512, dev)
    rows = []
    try:
        rng = random.Random(run)
        for i in range(12):
            body = json.dumps({"prompt": sb.prompt(rng, 1000 + 7 * i + 300 * run, 16, 49152), "max_tokens": 4,
                               "stream": True, "temperature": 0})
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
            t0 = time.perf_counter()
            c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            r = c.getresponse()
            ttft, tim = None, None
            for line in r:
                line = line.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]": continue
                ev = json.loads(line[6:])
                if ttft is None and ev.get("choices") and ev["choices"][0].get("text"): ttft = time.perf_counter() - t0
                if ev.get("timings"): tim = ev["timings"]
            c.close()
            rows.append((ttft * 1e3 if ttft else -1, tim))
    finally:
        srv.stop()
    for k, (t, tim) in enumerate(rows[:4] + rows[-2:]):
        print(f"run {run} req {k}: client ttft {t:.2f} ms; server queue {tim['queue_ms']:.3f} template {tim['template_ms']:.3f} prompt {tim['prompt_ms']:.3f} ttft {tim['ttft_ms']:.3f}")
