#!/usr/bin/env python3
"""Summarises an ncu --csv --page raw log (scripts/device_kernel_profile.sh) of forge-bench's
eager steps: the last whole step (from one embedding forward to the next), grouped by
kernel family, with time, count and share; --top N lists the N longest kernels."""
import collections, csv, re, sys

def family(name):
    n = name.lower()
    rules = [("gemm", r"nvjet|sm90_xmma|gemm|cutlass"), ("attention", r"cudnn|sdpa|fmha|flash"),
             ("optimizer", r"adamw|gradnorm|sumsquares|partialsfinish|meanreduce"),
             ("cross_entropy", r"crossentropy|cross_entropy|softmax"), ("rmsnorm", r"rmsnorm"),
             ("swiglu", r"swiglu"), ("rope", r"rope"), ("embedding", r"embedding|sort|segment"),
             ("fp8_cast", r"fp8|cast|amax"), ("copy/fill", r"memset|memcpy|fill|copy")]
    for fam, pat in rules:
        if re.search(pat, n): return fam
    return "other"

def main():
    path = sys.argv[1]; top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 0
    lines = [l for l in open(path) if l.startswith('"')]
    r = csv.reader(lines); hdr = next(r); next(r)
    ti, ni, gi = hdr.index("gpu__time_duration.sum"), hdr.index("Kernel Name"), hdr.index("Grid Size")
    rows = [(x[ni], float(x[ti].replace(",", "")) / 1e6, x[gi]) for x in r]
    # A step starts with its embedding forward (the deferred AdamW of the step before runs
    # inside it, unit by unit): the last whole step is between the last two such starts.
    starts = [i for i, (n, _, _) in enumerate(rows) if "EmbeddingForwardKernel" in n]
    if len(starts) >= 2:
        step = rows[starts[-2]:starts[-1]]
    else:  # no deferred update: a step ends with its AdamW kernel
        ends = [i for i, (n, _, _) in enumerate(rows) if "AdamWKernel(" in n]
        step = rows[(ends[-2] + 1 if len(ends) >= 2 else 0):ends[-1] + 1]
    tot = collections.defaultdict(float); cnt = collections.Counter()
    for n, t, _ in step: tot[family(n)] += t; cnt[family(n)] += 1
    all_ms = sum(tot.values())
    print(f"{len(step)} kernels, {all_ms:.2f} ms (serialised, ncu)")
    for fam, t in sorted(tot.items(), key=lambda kv: -kv[1]):
        print(f"  {fam:14s} {t:8.2f} ms  {cnt[fam]:5d} kernels  {100 * t / all_ms:5.1f}%")
    if top:
        by = collections.defaultdict(lambda: [0.0, 0])
        for n, t, g in step:
            k = (n[:90], g); by[k][0] += t; by[k][1] += 1
        for (n, g), (t, c) in sorted(by.items(), key=lambda kv: -kv[1][0])[:top]:
            print(f"  {t:7.3f} ms x{c:4d} grid {g:14s} {n}")

if __name__ == "__main__":
    main()
