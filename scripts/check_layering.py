#!/usr/bin/env python3
"""The source tree's layering: each component (a folder of src/; worker/ and kernels/ by
sub-folder) may include headers of its own and of the components below it in LAYERS, never
of one above. Prints every upward include and exits 1 if there is any, or if a folder of
src/ is missing from LAYERS (a new component is placed deliberately). Run by CTest
(Layering.NoUpwardIncludes) and by hand: scripts/check_layering.py [SRC_DIR]."""
import os
import re
import sys

# Lowest first. Why each sits where it does: docs/ARCHITECTURE.md ("Layers"). The build reads
# this list too (cmake/components.cmake: one library per entry, linking only entries before
# it): keep one quoted name per line.
LAYERS = [
    "common",            # Status, config, flags, checksums: depends on nothing of ours
    "kernels/cpu",       # the CPU reference ops
    "kernels/cuda",      # CUDA kernels and library wrappers
    "tokenizer",
    "rpc",               # gRPC channel and auth helpers
    "worker/model",      # CPU and CUDA models over the kernels, their parameter stores
    "worker/parallel",   # Comm (MPI, NCCL), rendezvous, process groups (over the model's layouts)
    "worker/optim",
    "worker/data",       # corpus, prepare, datasets, samplers
    "worker/checkpoint",
    "worker/hf",         # Hugging Face import and export
    "worker/train",      # trainer, backends, data parallelism
    "worker/infer",      # decoding, generation, evaluation (over the train backends)
    "worker/run",        # one process's part of a run (forge train and the worker agent)
    "metrics",           # Prometheus families and the trainer's metrics
    "plan",              # forge plan's cost model (over the memory estimate and layouts)
    "worker/agent",      # the worker process (forge-worker): coordinator link, gRPC
    "coordinator",
    "cli",               # forge and forgectl
]

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def component(path):
    parts = path.split("/")
    if parts[0] in ("worker", "kernels") and len(parts) > 2:
        return "/".join(parts[:2])
    return parts[0]


def main():
    src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "src")
    rank = {name: i for i, name in enumerate(LAYERS)}
    problems = []
    for root, _, files in os.walk(src):
        for f in sorted(files):
            rel = os.path.relpath(os.path.join(root, f), src).replace(os.sep, "/")
            if "/" not in rel:
                continue
            here = component(rel)
            if here not in rank:
                problems.append(f"{rel}: folder {here} is not in scripts/check_layering.py's LAYERS")
                continue
            with open(os.path.join(root, f), errors="replace") as fh:
                for n, line in enumerate(fh, 1):
                    m = INCLUDE.match(line)
                    if not m or "/" not in m.group(1):
                        continue
                    inc = m.group(1)
                    if not os.path.exists(os.path.join(src, inc)):
                        continue  # not ours (a generated or third-party header)
                    there = component(inc)
                    if there in rank and rank[there] > rank[here]:
                        problems.append(f"{rel}:{n}: {here} includes {inc} ({there} is above it)")
    for p in sorted(set(problems)):
        print(p)
    if problems:
        print(f"{len(set(problems))} layering problem(s); the order is LAYERS in {__file__}")
        return 1
    print(f"layering: {len(LAYERS)} components, no upward include")
    return 0


if __name__ == "__main__":
    sys.exit(main())
