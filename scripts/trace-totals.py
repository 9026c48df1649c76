#!/usr/bin/env python3
"""Where the GPU time of a whole run goes, from tools/kernel_trace's CSV: every kernel's own
start-to-end time summed per kernel name (eager launches and graph replays alike). For runs that
are not one replayed step — a prefill, a serving mix; for a replayed decode step trace-step.py
charges overlapped launches properly.

  export CUDA_INJECTION64_PATH=build/.../libqwen36_kernel_trace.so QWEN36_TRACE_OUT=trace.csv
  qwen36 bench --backend cuda --synthetic qwen3.6-27b --type q4_k_m -p 512 -n "" -r 1
  scripts/trace-totals.py trace.csv [--top 30] [--per N] [--exclude REGEX]

--per N divides the totals by N (the number of forwards the run made, bench's warm-up included).
--exclude drops kernels whose demangled name matches (e.g. a synthetic model's generation:
'random_blocks|repack_kernel|fill_kernel'). bench's ceiling lines add a few 8192³ cuBLAS GEMMs.
"""
import argparse
import collections
import csv
import importlib.util
import pathlib
import re
import signal


def trace_step():  # demangle / short of the sibling script
    path = pathlib.Path(__file__).with_name("trace-step.py")
    spec = importlib.util.spec_from_file_location("trace_step", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30, help="kernels to print (default 30)")
    ap.add_argument("--per", type=float, default=1.0, help="divide the totals by this (forwards in the run)")
    ap.add_argument("--exclude", help="drop kernels whose demangled name matches this regex")
    args = ap.parse_args()

    total = collections.Counter()
    calls = collections.Counter()
    with open(args.csv, newline="") as f:
        for r in csv.DictReader(f):
            total[r["name"]] += int(r["end_ns"]) - int(r["start_ns"])
            calls[r["name"]] += 1
    ts = trace_step()
    names = ts.demangle(total)
    if args.exclude:
        for name in [n for n in total if re.search(args.exclude, names[n])]:
            del total[name], calls[name]
    grand = sum(total.values())
    print(f"{sum(calls.values())} kernels, {grand / 1e6 / args.per:.3f} ms of kernel time (per {args.per:g})")
    print("| kernel | calls | ms | µs per call | share |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, ns in total.most_common(args.top):
        print(f"| {ts.short(names[name])[:90]} | {calls[name] / args.per:g} | {ns / 1e6 / args.per:.3f} | "
              f"{ns / 1e3 / calls[name]:.1f} | {100 * ns / grand:.1f}% |")


if __name__ == "__main__":
    main()
