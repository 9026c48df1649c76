#!/usr/bin/env python3
"""What each kernel of a replayed decode step costs, from tools/kernel_trace's CSV.

  export CUDA_INJECTION64_PATH=build/.../libqwen36_kernel_trace.so QWEN36_TRACE_OUT=trace.csv
  qwen36 bench --backend cuda --synthetic qwen3.6-27b --type q4_k_m -p "" -n 16 -r 1 -b 1
  scripts/trace-step.py trace.csv [--steps 8] [--sequence 40] [--min-kernels N] [--max-kernels M]

A graph launch's kernels share the launch's correlation id. The step graph is the graph id
launched most often among launches of at least --min-kernels kernels; its last --steps launches
are read. Kernels of a step are ordered by their end time, and each is charged the time from the
previous kernel's end to its own ("effective": with programmatic dependent launch a kernel starts
before the one before it ends, so its own start-to-end time double-counts the overlap; the
effective times add up to the step). Printed: per kernel name and grid, calls per step and mean
effective / own microseconds, their share of the step; the step span; the gap between steps
(host work between graph launches); with --sequence N the first N kernels of the last step in
order.
"""
import argparse
import collections
import csv
import re
import shutil
import signal
import statistics
import subprocess
import sys


def demangle(names):
    names = sorted(set(names))
    if not shutil.which("c++filt"):
        return {n: n for n in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def short(name):
    name = re.sub(r"^void ", "", name)
    if name.endswith(")"):  # the parameter list
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i]
                break
    name = re.sub(r"(qwen36::)?(cuda::)?(\(anonymous namespace\)::)?", "", name)
    return re.sub(r"\(DType\)", "D", name)


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # piped into head: stop quietly
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=8, help="last N launches of the step graph (default 8)")
    ap.add_argument("--min-kernels", type=int, default=50, help="a step graph has at least this many kernels")
    ap.add_argument("--max-kernels", type=int, default=1 << 30, help="and at most this many (e.g. a commit's graph)")
    ap.add_argument("--graph", type=int, help="the graph id to read (default: the most launched)")
    ap.add_argument("--sequence", type=int, default=0, help="print the first N kernels of the last step")
    args = ap.parse_args()

    launches = collections.defaultdict(list)
    with open(args.csv, newline="") as f:
        for r in csv.DictReader(f):
            if r["graph_id"] != "0":
                launches[int(r["correlation"])].append(r)
    big = {c: ks for c, ks in launches.items() if args.min_kernels <= len(ks) <= args.max_kernels}
    if not big:
        sys.exit(f"{args.csv}: no graph launch of {args.min_kernels}..{args.max_kernels} kernels")
    per_graph = collections.Counter(ks[0]["graph_id"] for ks in big.values())
    graph = str(args.graph) if args.graph is not None else per_graph.most_common(1)[0][0]
    steps = sorted((ks for ks in big.values() if ks[0]["graph_id"] == graph), key=lambda ks: int(ks[0]["start_ns"]))
    steps = steps[-args.steps:]
    if not steps:
        sys.exit(f"graph {graph}: no launches")
    names = demangle(k["name"] for ks in steps for k in ks)

    eff = collections.defaultdict(list)  # (name, grid) -> effective µs of every call
    own = collections.defaultdict(list)
    spans, gaps, prev_end = [], [], None
    for ks in steps:
        ks.sort(key=lambda k: int(k["end_ns"]))
        t0 = min(int(k["start_ns"]) for k in ks)
        last = t0
        for k in ks:
            key = (short(names[k["name"]]), k["grid"])
            end = int(k["end_ns"])
            eff[key].append((end - last) / 1e3)
            own[key].append((end - int(k["start_ns"])) / 1e3)
            last = end
        spans.append((last - t0) / 1e3)
        if prev_end is not None:
            gaps.append((t0 - prev_end) / 1e3)
        prev_end = last

    n = len(steps)
    span = statistics.mean(spans)
    print(f"graph {graph}: {len(steps[-1])} kernels a step, {n} steps read; "
          f"step span {span:.1f} us (min {min(spans):.1f}, max {max(spans):.1f})"
          + (f"; between steps {statistics.mean(gaps):.1f} us" if gaps else ""))
    print(f"| kernel | grid | calls/step | effective us/call | own us/call | us/step | share |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    rows = sorted(eff, key=lambda k: -sum(eff[k]))
    for key in rows:
        e, o = eff[key], own[key]
        per_step = sum(e) / n
        print(f"| {key[0][:90]} | {key[1]} | {len(e) / n:g} | {statistics.mean(e):.2f} | {statistics.mean(o):.2f} "
              f"| {per_step:.1f} | {100 * per_step / span:.1f}% |")
    if args.sequence:
        ks = steps[-1]
        t0 = min(int(k["start_ns"]) for k in ks)
        print(f"\nfirst {args.sequence} kernels of the last step (times from its first start, us):")
        print("| # | kernel | grid | start | end | effective |")
        print("| ---: | --- | --- | ---: | ---: | ---: |")
        last = t0
        for i, k in enumerate(ks[:args.sequence]):
            s, e = (int(k["start_ns"]) - t0) / 1e3, (int(k["end_ns"]) - t0) / 1e3
            print(f"| {i} | {short(names[k['name']])[:90]} | {k['grid']} | {s:.1f} | {e:.1f} | {e - (last - t0) / 1e3:.2f} |")
            last = int(k["end_ns"])


if __name__ == "__main__":
    main()
