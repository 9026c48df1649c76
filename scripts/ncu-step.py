#!/usr/bin/env python3
"""Where one decode step's GPU time goes, from an Nsight Compute CSV.

Run on the GPU machine (kernels profiled one at a time, cold L2, clocks left alone):

  ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \\
      qwen36 bench --backend cuda --synthetic qwen3.6-27b --type q4_k_m -p "" -n 2 -r 1 -b 1 > step.csv
  scripts/ncu-step.py step.csv [--step-start dequant_kernel]

Prints the kernels of the LAST decode step (from the last launch of the --step-start kernel, by
default the embedding lookup that opens a step) grouped by name and grid, with calls, total and
mean microseconds, and the step's sum. Each kernel runs alone under ncu, so the sum is larger
than a replayed step (programmatic dependent launch overlaps neighbours there): compare the two
to see how much the overlap hides.
"""
import argparse
import collections
import csv
import re
import sys


def read_kernels(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    for i, r in enumerate(rows):
        if r and r[0] == "ID":
            hdr, body = r, rows[i + 1:]
            break
    else:
        sys.exit(f"{path}: no ncu CSV header (a line starting with \"ID\")")
    name, grid, value = hdr.index("Kernel Name"), hdr.index("Grid Size"), hdr.index("Metric Value")
    out = []
    for r in body:
        if len(r) <= value:
            continue
        short = re.sub(r"^void |\(.*$|(qwen36|cuda)::(<unnamed>::)?", "", r[name])
        out.append((short, r[grid], float(r[value].replace(",", "")) / 1e3))  # ns -> us
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--step-start", default="dequant_kernel",
                    help="kernel name prefix that opens a decode step (default: the embedding lookup)")
    a = ap.parse_args()
    ks = read_kernels(a.csv)
    starts = [i for i, k in enumerate(ks) if k[0].startswith(a.step_start)]
    if not starts:
        sys.exit(f"no kernel named {a.step_start}* in {a.csv}; pick another --step-start")
    step = ks[starts[-1]:]
    groups = collections.defaultdict(list)
    for n, g, us in step:
        groups[(n, g)].append(us)
    total = sum(us for _, _, us in step)
    print(f"{len(step)} kernels, {total / 1e3:.3f} ms (each alone, cold L2)")
    print("| kernel | grid | calls | total us | mean us | share |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for (n, g), v in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        print(f"| {n} | {g} | {len(v)} | {sum(v):.1f} | {sum(v) / len(v):.2f} | {100 * sum(v) / total:.1f}% |")


if __name__ == "__main__":
    main()
