#!/usr/bin/env python3
"""serve_bench.py — kiln serve (and optionally llama-server) measured from a client (`make bench` runs it).

1. First-request penalty: a fresh server, once /health is 200, gets one streamed /v1/completions request of
   PROMPT_LEN token ids, then 20 more of the same length; each prompt starts with a different id, so no prompt
   cache is reused. Time to first token (TTFT) is from sending the request to the first streamed text, measured
   by this client the same way for both servers. Reported: first / median(next 20), over RUNS fresh servers.
2. Throughput: 1, 4 and 16 concurrent streaming clients (a server with 16 slots), each sending requests of
   PROMPT_LEN ids and GEN_LEN generated tokens: aggregate generated tokens/s and TTFT p50 / p99.

usage: serve_bench.py --kiln ./kiln [--llama-server 'PATH [SUBCOMMAND]'] --model M.gguf [--threads 2] [--runs 5]
       [--device cpu|cuda]
"""
import argparse
import http.client
import json
import os
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Server:
    def __init__(self, kind, binary, model, threads, slots, ctx, device):
        self.port = free_port()
        if kind == "kiln":
            cmd = [binary, "serve", "-m", model, "--port", str(self.port), "--threads", str(threads),
                   "--parallel", str(slots), "--ctx", str(ctx), "--device", device]
        else:
            cmd = shlex.split(binary) + ["-m", model, "--port", str(self.port), "-t", str(threads), "-np", str(slots),
                   "-c", str(ctx * slots), "--host", "127.0.0.1"]
            if device == "cuda":
                cmd += ["-ngl", "99"]
        self.kind = kind
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", "/health")
                r = c.getresponse()
                r.read()
                c.close()
                if r.status == 200:
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"{kind} exited with {self.proc.returncode}")
            time.sleep(0.02)
        raise RuntimeError(f"{kind} did not become healthy")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def stream(port, ids, n_gen, kind):
    """One streamed completion; returns (ttft seconds, generated chunks with text)."""
    body = {"prompt": ids, "max_tokens": n_gen, "temperature": 0, "stream": True}
    if kind == "llama":
        body["cache_prompt"] = False
        body["ignore_eos"] = True
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    t0 = time.perf_counter()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:200]}")
    ttft, n = None, 0
    for line in r:
        if not line.startswith(b"data: {"):
            continue
        ev = json.loads(line[6:])
        if ev.get("choices") and ev["choices"][0].get("text"):
            if ttft is None:
                ttft = time.perf_counter() - t0
            n += 1
        if ev.get("usage") and ev["usage"].get("completion_tokens"):
            n = ev["usage"]["completion_tokens"]
    c.close()
    return ttft, n


def prompt(rng, first, length, vocab):
    return [first] + [rng.randrange(1000, vocab) for _ in range(length - 1)]


def first_request_ratio(args, kind, binary):
    ratios, firsts, laters = [], [], []
    for run in range(args.runs):
        srv = Server(kind, binary, args.model, args.threads, 1, 512, args.device)
        try:
            rng = random.Random(run)
            ttfts = []
            for i in range(21):
                time.sleep(args.gap)  # the same idle time before every request (a GPU lowers its clocks when idle)
                ttfts.append(stream(srv.port, prompt(rng, 1000 + 7 * i + 300 * run, args.prompt_len, args.vocab), 4,
                                    kind)[0])
        finally:
            srv.stop()
        med = statistics.median(ttfts[1:])
        ratios.append(ttfts[0] / med)
        firsts.append(ttfts[0])
        laters.append(med)
    return statistics.median(ratios), statistics.median(firsts), statistics.median(laters), ratios


def throughput(args, kind, binary, clients):
    srv = Server(kind, binary, args.model, args.threads, 16, 512, args.device)
    ttfts, tokens, lock = [], [0], threading.Lock()

    def client(k):
        rng = random.Random(1000 + k)
        for i in range(args.requests):
            t, n = stream(srv.port, prompt(rng, 2000 + 50 * k + i, args.prompt_len, args.vocab), args.gen_len, kind)
            with lock:
                ttfts.append(t)
                tokens[0] += n

    try:
        t0 = time.perf_counter()
        th = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        wall = time.perf_counter() - t0
    finally:
        srv.stop()
    ttfts.sort()
    p99 = ttfts[min(len(ttfts) - 1, int(round(0.99 * (len(ttfts) - 1))))]
    return tokens[0] / wall, statistics.median(ttfts), p99


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="./kiln")
    ap.add_argument("--llama-server")
    ap.add_argument("--model", required=True)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--gen-len", type=int, default=32)
    ap.add_argument("--requests", type=int, default=3, help="requests per client in the throughput runs")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--gap", type=float, default=0.0,
                    help="seconds of idle before each request of the first-request test (default 0)")
    args = ap.parse_args()
    servers = [("kiln", args.kiln)] + ([("llama", args.llama_server)] if args.llama_server else [])
    print(f"model {os.path.basename(args.model)}, {args.threads} threads, device {args.device}, "
          f"prompts of {args.prompt_len} ids, {args.runs} fresh servers")
    for kind, binary in servers:
        r, f, l, all_r = first_request_ratio(args, kind, binary)
        print(f"{kind:6s} first-request TTFT {f * 1e3:.2f} ms, median of the next 20 {l * 1e3:.2f} ms, "
              f"ratio {r:.3f} (runs: {', '.join(f'{x:.2f}' for x in all_r)})")
        sys.stdout.flush()
    if args.skip_throughput:
        return
    for kind, binary in servers:
        for n in (1, 4, 16):
            tps, p50, p99 = throughput(args, kind, binary, n)
            print(f"{kind:6s} {n:2d} clients: {tps:8.1f} tok/s aggregate, TTFT p50 {p50 * 1e3:.1f} ms, "
                  f"p99 {p99 * 1e3:.1f} ms ({n * args.requests} requests of {args.gen_len} tokens)")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
