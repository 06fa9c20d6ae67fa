#!/usr/bin/env python3
"""Turns what the tools of bench/suite.sh print into the suite's JSON lines, one object a line,
each tagged "suite" and "label" (standard library only; the GPU machine's python3 runs it).

  suite_lines.py gpus --suite S                    nvidia-smi --query-gpu=name,clocks.max.sm,
                                                   power.limit --format=csv,noheader,nounits
                                                   on stdin
  suite_lines.py train METRICS LOG --suite S --label L
                                                   a `forge train` run: its validation losses
                                                   (metrics.jsonl), its first and last logged
                                                   training loss and the summary of its log
  suite_lines.py gtest LOG --suite S --label L     a GoogleTest log: one line a test, then counts
  suite_lines.py ncu LOG [--top N] --suite S --label L
                                                   ncu --csv --page raw of forge-bench's eager
                                                   steps: the last whole step by kernel family,
                                                   and its N longest kernels
  suite_lines.py dmon FILE --suite S --label L     nvidia-smi dmon -s pc: the range of power and
                                                   SM clock while the GPU is loaded
"""
import collections
import csv
import json
import re
import sys


def emit(tags, **fields):
    print(json.dumps({**tags, **fields}))


def gpus(_, tags):
    rows = [[c.strip() for c in line.split(",")] for line in sys.stdin if line.strip()]
    devices = []
    for name, clock, power in rows:
        devices.append({"name": name, "max_sm_mhz": float(clock), "power_limit_w": float(power)})
    emit({**tags, "label": "gpus"}, gpus=devices)


# `forge: done: 2000 steps in 48.8 s, 671012 tokens/s | train loss 5.0123 | val loss 10.9831 ->
# 5.0595 (unigram baseline 8.0712) | metrics ...`
DONE = re.compile(r"forge: done: (\d+) steps(?: \([^)]*\))? in ([0-9.]+) s, ([0-9.]+) tokens/s"
                  r".*?val loss (?:([0-9.]+) -> )?([0-9.]+)")
# `step 0/200 | val loss 12.6021`: the validation loss before the first step.
STEP0 = re.compile(r"step 0/\d+ \| val loss ([0-9.]+)")


def train(args, tags):
    metrics, log = args
    skipped = 0
    try:
        records = [json.loads(line) for line in open(metrics) if line.startswith("{")]
    except OSError as e:
        emit(tags, error=f"no metrics: {e.strerror}: {metrics}")
        return
    losses = []
    for r in records:
        skipped = max(skipped, r.get("skipped_steps", 0))
        if "val_loss" in r:
            emit(tags, step=r["step"], val_loss=r["val_loss"])
        if "loss" in r:
            losses.append((r["step"], r["loss"]))
    done = None
    step0 = None  # where the closing line lacks it (ranks in processes of their own)
    for line in open(log, errors="replace"):
        done = DONE.search(line) or done
        step0 = step0 or STEP0.match(line)
    if done is None:
        emit(tags, error=f"no 'forge: done' line in {log}")
        return
    first_val = done.group(4) or (step0 and step0.group(1))
    first = {"first_val_loss": float(first_val)} if first_val else {}
    if losses:
        first.update(first_train_step=losses[0][0], first_train_loss=losses[0][1],
                     final_train_step=losses[-1][0], final_train_loss=losses[-1][1])
    emit(tags, summary=True, steps=int(done.group(1)), seconds=float(done.group(2)),
         tokens_per_s=float(done.group(3)), final_val_loss=float(done.group(5)),
         skipped_steps=skipped, **first)


# "[       OK ] Suite.Test (12 ms)", "[  FAILED  ] Suite/Param.Test/0, where GetParam() = ...
# (340 ms)", "[  SKIPPED ] Suite.Test (0 ms)"; a test that started and never ended (killed at
# the time limit, or a crash) is "unfinished".
GTEST_END = re.compile(r"^\[ +(OK|FAILED|SKIPPED) +\] (\S+?)(?:,.*)? \((\d+) ms\)$")
GTEST_RUN = re.compile(r"^\[ RUN +\] (\S+)$")


def gtest(args, tags):
    status = {}
    order = []
    for line in open(args[0], errors="replace"):
        line = line.rstrip("\n")
        m = GTEST_RUN.match(line)
        if m:
            order.append(m.group(1))
            status[m.group(1)] = ("unfinished", 0)
            continue
        m = GTEST_END.match(line)
        if m:
            word = {"OK": "passed", "FAILED": "failed", "SKIPPED": "skipped"}[m.group(1)]
            if m.group(2) not in status:
                order.append(m.group(2))
            status[m.group(2)] = (word, int(m.group(3)))
    counts = collections.Counter(s for s, _ in status.values())
    for test in order:
        s, ms = status[test]
        emit(tags, test=test, status=s, ms=ms)
    emit(tags, summary=True, tests=len(order), passed=counts["passed"],
         failed=counts["failed"], skipped=counts["skipped"], unfinished=counts["unfinished"],
         seconds=round(sum(ms for _, ms in status.values()) / 1000, 1))


FAMILIES = [("gemm", r"nvjet|sm90_xmma|gemm|cutlass"), ("attention", r"cudnn|sdpa|fmha|flash"),
            ("optimizer", r"adamw|gradnorm|sumsquares|partialsfinish|meanreduce"),
            ("cross_entropy", r"crossentropy|cross_entropy|softmax"), ("rmsnorm", r"rmsnorm"),
            ("swiglu", r"swiglu"), ("rope", r"rope"), ("embedding", r"embedding|sort|segment"),
            ("fp8_cast", r"fp8|cast|amax|transpose"), ("copy/fill", r"memset|memcpy|fill|copy")]


def family(kernel):
    k = kernel.lower()
    for name, pattern in FAMILIES:
        if re.search(pattern, k):
            return name
    return "other"


def ncu(args, tags):
    top = 0
    if "--top" in args:
        top = int(args[args.index("--top") + 1])
    rows_in = [line for line in open(args[0], errors="replace") if line.startswith('"')]
    if len(rows_in) < 3:
        emit(tags, error=f"no kernel rows in {args[0]}")
        return
    reader = csv.reader(rows_in)
    header = next(reader)
    next(reader)  # units
    ti, ni = header.index("gpu__time_duration.sum"), header.index("Kernel Name")
    gi = header.index("Grid Size") if "Grid Size" in header else None
    rows = [(r[ni], float(r[ti].replace(",", "")) / 1e6, r[gi] if gi is not None else "")
            for r in reader]
    # A step starts with its embedding forward (the deferred AdamW of the step before runs
    # inside that forward, unit by unit): the last whole step is between the last two starts.
    # Without a deferred update a step ends with its AdamW kernel.
    starts = [i for i, (n, _, _) in enumerate(rows) if "EmbeddingForwardKernel" in n]
    if len(starts) >= 2:
        step = rows[starts[-2]:starts[-1]]
    else:
        ends = [i for i, (n, _, _) in enumerate(rows) if "AdamWKernel(" in n]
        if not ends:
            emit(tags, error="no whole step found (no embedding forward or AdamW kernel)")
            return
        step = rows[(ends[-2] + 1 if len(ends) >= 2 else 0):ends[-1] + 1]
    total = sum(t for _, t, _ in step)
    ms, count = collections.defaultdict(float), collections.Counter()
    for n, t, _ in step:
        ms[family(n)] += t
        count[family(n)] += 1
    emit(tags, kernels=len(step), ms=round(total, 3))
    for f, t in sorted(ms.items(), key=lambda kv: -kv[1]):
        emit(tags, family=f, ms=round(t, 3), kernels=count[f], share=round(t / total, 4))
    longest = collections.defaultdict(lambda: [0.0, 0])
    for n, t, g in step:
        longest[(n[:90], g)][0] += t
        longest[(n[:90], g)][1] += 1
    for (n, g), (t, c) in sorted(longest.items(), key=lambda kv: -kv[1][0])[:top]:
        emit(tags, kernel=n, grid=g, ms=round(t, 3), calls=c)


def dmon(args, tags):
    cols, power, clock = None, [], []
    for line in open(args[0], errors="replace"):
        words = line.split()
        if line.startswith("#"):
            if cols is None and len(words) > 1 and words[1] == "gpu":
                cols = words[1:]
            continue
        if cols is None or len(words) != len(cols):
            continue
        row = dict(zip(cols, words))
        try:
            power.append(float(row["pwr"]))
            clock.append(float(row["pclk"]))
        except (KeyError, ValueError):
            continue  # "-" where the driver has no reading
    if not power:
        emit(tags, error=f"no dmon samples in {args[0]}")
        return
    # The loaded part: samples at 80% of the highest power or more (not the process's start).
    busy = [(p, c) for p, c in zip(power, clock) if p >= 0.8 * max(power)]
    emit(tags, samples=len(busy), power_w_min=min(p for p, _ in busy),
         power_w_max=max(p for p, _ in busy), sm_mhz_min=min(c for _, c in busy),
         sm_mhz_max=max(c for _, c in busy))


def main(argv):
    kinds = {"gpus": gpus, "train": train, "gtest": gtest, "ncu": ncu, "dmon": dmon}
    if len(argv) < 2 or argv[1] not in kinds:
        sys.exit(__doc__)
    rest, tags = [], {}
    i = 2
    while i < len(argv):
        if argv[i] in ("--suite", "--label"):
            tags[argv[i][2:]] = argv[i + 1]
            i += 2
        else:
            rest.append(argv[i])
            i += 1
    kinds[argv[1]](rest, tags)


if __name__ == "__main__":
    main(sys.argv)
