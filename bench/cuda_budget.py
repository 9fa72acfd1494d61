#!/usr/bin/env python3
"""cuda_budget.py — the per-kernel budget of the last decode step from an ncu CSV report (bench/cuda_budget.sh).

ncu --csv writes one row per metric per profiled kernel (ID, Kernel Name, Metric Name, Metric Unit, Metric Value,
...). The last decode step starts at the last k_embed launch and runs to the end of the report. Its kernels are
grouped by name + grid size; per group: launches, time and DRAM bytes (read + write) per launch, the floor of
those bytes at the HBM bandwidth (default 4.3 TB/s, --tbps), and totals. Prints a Markdown table.
usage: cuda_budget.py REPORT.csv [--tbps 4.3] [--title TEXT] [--prefill N]
(--prefill N: the kernels of the last prefill of N tokens, from its k_embed launch to the next one)
"""
import argparse
import csv
import sys

TIME = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6, "s": 1e6}
BYTES = {"byte": 1, "B": 1, "Kbyte": 1e3, "KB": 1e3, "Mbyte": 1e6, "MB": 1e6, "Gbyte": 1e9, "GB": 1e9,
         "Kibyte": 1024, "KiB": 1024, "Mibyte": 1 << 20, "MiB": 1 << 20, "Gibyte": 1 << 30, "GiB": 1 << 30}


def number(text):
    return float(text.replace(",", "").strip() or "nan")


def short_name(name):
    """'void k_matvec<(ck_type)3>(mv_args)' -> 'k_matvec<(ck_type)3>' (the parameter list cut at depth 0)."""
    name = name.strip()
    if name.startswith("void "):
        name = name[5:]
    depth = 0
    for i, c in enumerate(name):
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0 and i > 0:
            return name[:i]
    return name


def read_kernels(path):
    """{id: {"name": str, metric: value in us / bytes / count}} from the CSV rows of an ncu report."""
    with open(path, newline="", errors="replace") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    rows = list(csv.reader(lines))
    if not rows:
        sys.exit(f"cuda_budget.py: no CSV rows in {path} (did ncu profile any kernel?)")
    head = rows[0]
    try:
        col = {k: head.index(k) for k in ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value")}
    except ValueError as e:
        sys.exit(f"cuda_budget.py: {path}: unexpected header {head[:8]}: {e}")
    kernels = {}
    for r in rows[1:]:
        if len(r) < len(head) or not r[col["ID"]].strip().isdigit():
            continue
        k = kernels.setdefault(int(r[col["ID"]]), {"name": r[col["Kernel Name"]]})
        metric, unit, value = r[col["Metric Name"]], r[col["Metric Unit"]].strip(), number(r[col["Metric Value"]])
        if metric.startswith("gpu__time_duration"):
            if unit not in TIME:
                sys.exit(f"cuda_budget.py: unknown time unit {unit!r}")
            value *= TIME[unit]
        elif metric.startswith("dram__bytes"):
            if unit not in BYTES:
                sys.exit(f"cuda_budget.py: unknown byte unit {unit!r}")
            value *= BYTES[unit]
        k[metric] = value
    return kernels


def last_step(kernels, prefill=0):
    """The kernels from the last k_embed launch to the end (the last decode step); with prefill = N, from the
    last k_embed launch of grid N (a prefill of N tokens) to the next k_embed launch."""
    ids = sorted(kernels)
    embeds = [i for i in ids if "k_embed" in kernels[i]["name"]]
    if prefill:
        starts = [i for i in embeds if int(kernels[i].get("launch__grid_size", 0)) == prefill]
        if not starts:
            sys.exit(f"cuda_budget.py: no k_embed launch of grid {prefill}: cannot find the prefill")
        ends = [i for i in embeds if i > starts[-1]]
        end = ends[0] if ends else ids[-1] + 1
        return [kernels[i] for i in ids if starts[-1] <= i < end]
    if not embeds:
        sys.exit("cuda_budget.py: no k_embed launch in the report: cannot find the decode step")
    return [kernels[i] for i in ids if i >= embeds[-1]]


def table(step, tbps, title, prefill=0):
    groups = {}
    for k in step:
        key = (short_name(k["name"]), int(k.get("launch__grid_size", 0)), int(k.get("launch__block_size", 0)))
        g = groups.setdefault(key, {"n": 0, "us": 0.0, "bytes": 0.0, "first": len(groups)})
        g["n"] += 1
        g["us"] += k.get("gpu__time_duration.sum", 0.0)
        g["bytes"] += k.get("dram__bytes_read.sum", 0.0) + k.get("dram__bytes_write.sum", 0.0)
    floor_us = lambda b: b / (tbps * 1e12) * 1e6
    out = [f"### {title}" if title else "", "",
           f"| kernel | grid x block | n | us each | bytes each | floor each ({tbps:g} TB/s) | us total | share |",
           "|---|---|---|---|---|---|---|---|"]
    total_us = sum(g["us"] for g in groups.values())
    total_b = sum(g["bytes"] for g in groups.values())
    for (name, grid, block), g in sorted(groups.items(), key=lambda kv: kv[1]["first"]):
        n = g["n"]
        out.append(f"| {name} | {grid} x {block} | {n} | {g['us'] / n:.2f} | {g['bytes'] / n / 1e3:.1f} KB | "
                   f"{floor_us(g['bytes'] / n):.3f} us | {g['us']:.1f} | {100 * g['us'] / total_us:.1f}% |")
    n_all = sum(g["n"] for g in groups.values())
    out.append(f"| **sum** | | {n_all} | | {total_b / 1e6:.2f} MB | {floor_us(total_b):.1f} us | {total_us:.1f} | 100% |")
    out.append("")
    per = (f"for {prefill} tokens ({prefill * 1e6 / total_us:.0f} tok/s" if prefill else
           f"per step ({1e6 / total_us:.0f} tok/s")
    out.append(f"{n_all} kernels; kernel time {total_us:.1f} us {per} if nothing else "
               f"counted); DRAM bytes {total_b / 1e6:.2f} MB, their floor {floor_us(total_b):.1f} us "
               f"({100 * floor_us(total_b) / total_us:.1f}% of the kernel time)")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("report")
    ap.add_argument("--tbps", type=float, default=4.3)
    ap.add_argument("--title", default="")
    ap.add_argument("--prefill", type=int, default=0, help="the last prefill of this many tokens instead")
    a = ap.parse_args()
    print(table(last_step(read_kernels(a.report), a.prefill), a.tbps, a.title, a.prefill))


if __name__ == "__main__":
    main()
