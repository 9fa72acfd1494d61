#!/usr/bin/env python3
"""run_phases.py — `kiln run` phase timings and the first-call penalty, median of N fresh processes.

usage: bench/run_phases.py [--kiln ./kiln] [--n 10] [--tokens 64] [--device cpu] MODEL.gguf [...]
Each process runs `kiln run --json --rounds 2 --temp 0` on the model; the script prints the median of every
open phase, of round 1 and round 2 (prefill + decode) and of the first-call penalty (round 1 - round 2).
"""
import argparse, json, statistics, subprocess, sys

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="./kiln")
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", default="")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    for model in a.models:
        runs = []
        for _ in range(a.n):
            cmd = [a.kiln, "run", "-m", model, "--json", "--rounds", "2", "--temp", "0", "-n", str(a.tokens),
                   "--device", a.device, "--ignore-eos"]
            if a.prompt:
                cmd += ["-p", a.prompt]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs.append(json.loads(out))
        med = lambda xs: statistics.median(xs) / 1e6
        phases = runs[0]["open_phases"].keys()
        print(f"## {model}  ({a.n} processes, {a.tokens} tokens, backend {runs[0]['backend']})")
        print("open total %.3f ms: " % med([r["load_duration"] for r in runs]) +
              ", ".join("%s %.3f" % (p[5:], med([r["open_phases"][p] for r in runs])) for p in phases))
        for i in (0, 1):
            pre = med([r["rounds"][i]["prompt_eval_duration"] for r in runs])
            dec = med([r["rounds"][i]["eval_duration"] for r in runs])
            steps = runs[0]["rounds"][i]["decode_steps"]
            print(f"round {i+1}: prefill {runs[0]['rounds'][i]['prompt_eval_count']} tok {pre:.3f} ms, "
                  f"decode {steps} steps {dec:.3f} ms ({steps / (dec / 1e3):.0f} tok/s)")
        pen = [r["first_call_penalty_ns"] for r in runs]
        r2 = [r["rounds"][1]["total_duration"] for r in runs]
        print("first-call penalty: median %+.3f ms (min %+.3f, max %+.3f); %.1f%% of round 2" %
              (med(pen), min(pen) / 1e6, max(pen) / 1e6, 100 * statistics.median(pen) / statistics.median(r2)))
        print()

if __name__ == "__main__":
    sys.exit(main())
