#!/usr/bin/env python3
"""Markdown tables from bench/suite.sh's JSON lines (standard library only).

  suite_table.py FILE.jsonl [FILE.jsonl ...]      (no file: stdin)

Each line is one object tagged "suite" and "label". Lines of each suite become that suite's
tables, in the order the suites first appear:
  single-gpu    forge-bench and torch_baseline.py lines: one row a run, with the ratio to Forge
                BF16 (same model, micro-batch and build) and to PyTorch (same model and batch)
  llama         forge-bench and torch_llama.py lines: one row a run, with the ratio to the
                PyTorch recipe's fastest run (no checkpointing) and to its run at the same
                recompute setting (full: full checkpointing)
  multi-gpu     forge-dist-bench and torch_dist.py lines: one row a run, the ratio of ddp and
                fsdp to PyTorch's DDP and FSDP2 at the same world size; the accumulation check
  llama-dp      as llama-fsdp, with each run's share of one GPU's speed
  nodes         as multi-gpu, each run named by its topology (one node or emulated nodes)
  llama-fsdp    forge-dist-bench --no-single and torch_llama.py lines: one row a run, with the
                ratio to the PyTorch recipe's run without checkpointing and at the same recompute
                setting, at the same world size
  fp8-accuracy  validation losses by step, one column a run, each against the first run
  llama-train   one row a run: steps, time, tokens/s, first and last training and validation
                losses
  generation    forge-generate-bench and hf_generate_anchor.py lines: one row a run, with the
                decode tokens/s ratio to transformers (same model and batch)
  gpu-tests     counts, and every test that did not pass
  profile       forge-bench --profile phases, ncu families and longest kernels, power
Lines with "error" are listed under their suite's table.
"""
import collections
import json
import sys


def fmt(v, digits=2):
    if v is None or v == "":
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def pct(v, digits=1):
    return "" if v is None else f"{100 * v:.{digits}f}%"


def ratio(a, b):
    return f"{a / b:.3f}x" if a and b else ""


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def devices(lines):
    for line in lines:
        if line.get("label") == "gpus":
            names = collections.Counter(
                f"{g['name']} ({g['max_sm_mhz']:.0f} MHz, {g['power_limit_w']:.0f} W)"
                for g in line["gpus"])
            return "Device: " + ", ".join(f"{n} x {d}" for d, n in names.items())
    return None


def build_of(line):
    return "base" if line["label"].endswith("-base") else "new"


PRECISION = {("bf16", False): "BF16", ("fp8", False): "FP8", ("fp8", True): "FP8 + FP8 LM head"}


def single_gpu(lines):
    forge = [l for l in lines if "tokens_per_s" in l and "precision" in l]
    torch = {(l["model"], l["B"]): l for l in lines if "compile" in l and "tokens_per_s" in l}
    bf16 = {(l["model"], l["B"], build_of(l)): l["tokens_per_s"] for l in forge
            if l["precision"] == "bf16"}
    with_base = any(build_of(l) == "base" for l in forge)
    header = ["model", "B", "run"] + (["build"] if with_base else []) + [
        "step ms", "tokens/s", "MFU", "peak GiB", "first step s (PyTorch: warm-up)",
        "vs Forge BF16", "vs PyTorch"]
    rows = []
    for l in forge:
        key = (l["model"], l["B"])
        t = torch.get(key)
        rows.append([l["model"], str(l["B"]),
                     "Forge " + PRECISION.get((l["precision"], bool(l.get("fp8_lm_head"))),
                                              l["precision"])] +
                    ([build_of(l)] if with_base else []) +
                    [fmt(l["step_ms"]), fmt(round(l["tokens_per_s"])), pct(l.get("mfu")),
                     fmt(l.get("peak_mem_gib")), fmt(l.get("first_step_s"), 1),
                     ratio(l["tokens_per_s"], bf16.get(key + (build_of(l),))),
                     ratio(l["tokens_per_s"], t and t["tokens_per_s"])])
    for (model, b), t in torch.items():
        rows.append([model, str(b), "PyTorch compiled BF16" if t["compile"] else "PyTorch eager"] +
                    ([""] if with_base else []) +
                    [fmt(t["step_ms"]), fmt(round(t["tokens_per_s"])), pct(t.get("mfu")),
                     fmt(t.get("peak_mem_gib")), fmt(t.get("warm_s"), 1), "", "1.000x"])
    rows.sort(key=lambda r: (r[0], int(r[1])))
    return [table(header, rows)]


# torch_llama.py's model names for the Llama presets.
TORCH_LLAMA = {"llama1b": "llama3-1b", "llama3b": "llama3-3b", "llama8b": "llama3-8b"}


def llama(lines):
    forge = [l for l in lines if "tokens_per_s" in l and "recompute" in l]
    torch = {(TORCH_LLAMA.get(l["model"], l["model"]), l["B"], l["ac"]): l for l in lines
             if "tokens_per_s_per_gpu" in l and "ac" in l}
    with_base = any(build_of(l) == "base" for l in forge)
    header = ["model", "B", "run"] + (["build"] if with_base else []) + [
        "recompute", "step ms", "tokens/s", "MFU", "peak GiB", "vs PyTorch (none)",
        "vs PyTorch (same recompute)"]
    rows = []
    for l in forge:
        key = (l["model"], l["B"])
        fastest, same = torch.get(key + ("none",)), torch.get(key + (l["recompute"],))
        rows.append([l["model"], str(l["B"]), "Forge " + PRECISION.get(
                         (l["precision"], bool(l.get("fp8_lm_head"))), l["precision"])] +
                    ([build_of(l)] if with_base else []) +
                    [l["recompute"], fmt(l["step_ms"]), fmt(round(l["tokens_per_s"])),
                     pct(l.get("mfu")), fmt(l.get("peak_mem_gib")),
                     ratio(l["tokens_per_s"], fastest and fastest["tokens_per_s_per_gpu"]),
                     ratio(l["tokens_per_s"], same and same["tokens_per_s_per_gpu"])])
    for (model, b, ac), t in torch.items():
        rows.append([model, str(b), "PyTorch FSDP2 recipe BF16"] + ([""] if with_base else []) +
                    [ac, fmt(t["step_ms"]), fmt(round(t["tokens_per_s_per_gpu"])),
                     pct(t.get("mfu")), fmt(t.get("peak_mem_gib")), "", ""])
    return [table(header, rows)]


def multi_gpu(lines):
    forge = [l for l in lines if "scaling_efficiency" in l]
    torch = {(l["mode"], l["world"]): l for l in lines
             if "tokens_per_s_per_gpu" in l and "scaling_efficiency" not in l}
    with_base = any(build_of(l) == "base" for l in forge)
    header = ["run", "world"] + (["build"] if with_base else []) + [
        "tokens/s per GPU", "one GPU", "efficiency", "peak GiB", "comm alone / exposed ms",
        "exposed: stalled + slowdown ms", "ranks bitwise equal", "PyTorch per GPU", "vs PyTorch"]
    rows = []
    for l in forge:
        run = l["mode"] + (", bf16 gradients" if l.get("grad_reduce") == "bf16" else "")
        if l.get("precision") == "fp8":
            run += ", FP8"
        if l.get("ddp_allreduce") == "copy_engine":
            run += ", copy engines"
        if l.get("batches", "").startswith("distinct"):
            run += ", distinct batches"
        if l["mode"] == "hsdp" and "shard_group_size" in l:
            run += f", groups of {l['shard_group_size']}"
        if "emulated_nodes" in l:
            run += f", {l['emulated_nodes']} emulated nodes"
        # PyTorch trains one batch on every rank: only same-batch runs compare with it.
        t = None if "distinct" in run else torch.get((l["mode"], l["world"]))
        rows.append([run, str(l["world"])] + ([build_of(l)] if with_base else []) +
                    [fmt(round(l["tokens_per_s_per_gpu"])),
                     fmt(round(l["single_gpu_tokens_per_s"])),
                     pct(l["scaling_efficiency"], 2), fmt(l.get("peak_mem_gib")),
                     f"{fmt(l.get('comm_ms'))} / {fmt(l.get('comm_exposed_ms'))}",
                     f"{fmt(l.get('comm_wait_ms'))} + {fmt(l.get('comm_slowdown_ms'))}"
                     if "comm_wait_ms" in l else "",
                     fmt(l.get("ranks_bitwise_equal")),
                     fmt(round(t["tokens_per_s_per_gpu"])) if t else "",
                     ratio(l["tokens_per_s_per_gpu"], t and t["tokens_per_s_per_gpu"])])
    for (mode, world), t in torch.items():
        name = {"ddp": "PyTorch DDP", "fsdp": "PyTorch FSDP2"}.get(mode, "PyTorch " + mode)
        rows.append([name, str(world)] + ([""] if with_base else []) +
                    [fmt(round(t["tokens_per_s_per_gpu"])), "", "", fmt(t.get("peak_mem_gib")),
                     "", "", "", "", ""])
    out = [table(header, rows)]
    checks = [l for l in forge if "accum_loss" in l]
    if checks:
        out.append(table(
            ["run", "world", "data-parallel loss", "ranks' own batches", "one GPU accumulating",
             "its losses on those batches"],
            [[l["label"], str(l["world"]), fmt(l["loss"], 4),
              ", ".join(fmt(x, 3) for x in l.get("rank_eval_losses", [])),
              fmt(l["accum_loss"], 4),
              ", ".join(fmt(x, 3) for x in l.get("accum_eval_losses", []))] for l in checks]))
    return out


def llama_fsdp(lines, one_gpu=False):
    """one_gpu: a column with each run's share of one GPU's speed (llama-dp)."""
    forge = [l for l in lines if "tokens_per_s_per_gpu" in l and "mode" in l and "ac" not in l]
    torch = {(TORCH_LLAMA.get(l["model"], l["model"]), l["world"], l["ac"]): l for l in lines
             if "tokens_per_s_per_gpu" in l and "ac" in l}
    header = ["model", "GPUs", "run", "recompute", "step ms", "tokens/s per GPU", "MFU",
              "peak GiB", "collectives in step / stalled ms"] + (
                 ["one GPU (tokens/s)", "of one GPU"] if one_gpu else []) + [
                 "vs PyTorch (none)", "vs PyTorch (same recompute)"]
    rows = []
    for l in forge:
        key = (l["model"], l["world"])
        fastest, same = torch.get(key + ("none",)), torch.get(key + (l["recompute"],))
        run = "Forge " + l["mode"] + " " + PRECISION.get((l["precision"], False), l["precision"])
        if l.get("fp8_gather") is False:
            run += ", bf16 gather"
        single = l.get("single_gpu_tokens_per_s")
        rows.append([l["model"], str(l["world"]), run, l["recompute"], fmt(l["step_ms"]),
                     fmt(round(l["tokens_per_s_per_gpu"])), pct(l.get("mfu")),
                     fmt(l.get("peak_mem_gib")),
                     f"{fmt(l.get('comm_in_step_ms'))} / {fmt(l.get('comm_wait_ms'))}"] +
                    ([fmt(round(single)) if single else "",
                      pct(l.get("scaling_efficiency"), 2)] if one_gpu else []) +
                    [ratio(l["tokens_per_s_per_gpu"], fastest and fastest["tokens_per_s_per_gpu"]),
                     ratio(l["tokens_per_s_per_gpu"], same and same["tokens_per_s_per_gpu"])])
    for (model, world, ac), t in torch.items():
        rows.append([model, str(world), "PyTorch FSDP2 recipe BF16", ac, fmt(t["step_ms"]),
                     fmt(round(t["tokens_per_s_per_gpu"])), pct(t.get("mfu")),
                     fmt(t.get("peak_mem_gib")), ""] + (["", ""] if one_gpu else []) + ["", ""])
    return [table(header, rows)]


def llama_dp(lines):
    return llama_fsdp(lines, one_gpu=True)


def fp8_accuracy(lines):
    runs = list(dict.fromkeys(l["label"] for l in lines if "val_loss" in l or "summary" in l))
    if not runs:
        return []
    loss = collections.defaultdict(dict)
    for l in lines:
        if "val_loss" in l:
            loss[l["step"]][l["label"]] = l["val_loss"]
    ref = runs[0]
    header = ["step"] + runs + [f"{r} vs {ref}" for r in runs[1:]]
    rows, worst = [], collections.defaultdict(float)
    for s in sorted(loss):
        v = loss[s]
        diffs = []
        for r in runs[1:]:
            if r in v and ref in v:
                d = v[r] / v[ref] - 1
                worst[r] = max(worst[r], abs(d))
                diffs.append(f"{100 * d:+.2f}%")
            else:
                diffs.append("")
        rows.append([str(s)] + [fmt(v.get(r), 4) for r in runs] + diffs)
    out = [table(header, rows)]
    summary = {l["label"]: l for l in lines if l.get("summary")}
    srows = [[r, fmt(summary[r].get("steps")), fmt(summary[r].get("seconds"), 1),
              fmt(round(summary[r].get("tokens_per_s", 0))),
              fmt(summary[r].get("final_val_loss"), 4), fmt(summary[r].get("skipped_steps")),
              pct(worst[r], 2) if r in worst else ""]
             for r in runs if r in summary]
    if srows:
        out.append(table(["run", "steps", "seconds", "tokens/s", "final val loss",
                          "skipped steps", f"largest difference vs {ref}"], srows))
    return out


def llama_train(lines):
    runs = [l for l in lines if l.get("summary")]
    if not runs:
        return []
    rows = [[l["label"], fmt(l.get("steps")), fmt(l.get("seconds"), 1),
             fmt(round(l.get("tokens_per_s", 0))),
             f"{fmt(l.get('first_train_loss'), 4)} (step {l.get('first_train_step', '?')})",
             f"{fmt(l.get('final_train_loss'), 4)} (step {l.get('final_train_step', '?')})",
             fmt(l.get("first_val_loss"), 4), fmt(l.get("final_val_loss"), 4),
             fmt(l.get("skipped_steps"))] for l in runs]
    return [table(["run", "steps", "seconds", "tokens/s", "first train loss",
                   "last train loss", "first val loss", "last val loss", "skipped steps"],
                  rows)]


def generation(lines):
    runs = [l for l in lines if l.get("bench") == "generate"]
    hf = {(l["model"], l["B"]): l for l in runs if l["backend"].startswith("transformers")}
    rows = []
    for l in runs:
        t = hf.get((l["model"], l["B"]))
        rows.append([l["model"], str(l["B"]), l["backend"], fmt(l["prompt_len"]),
                     fmt(l["new_tokens"]), fmt(1e3 * l["prefill_s"]),
                     fmt(l["decode_ms_per_step"]), fmt(l["decode_tokens_per_s"], 0),
                     fmt(l["tokens_per_s"], 0),
                     "" if t is None or t is l else ratio(l["decode_tokens_per_s"],
                                                         t["decode_tokens_per_s"])])
    return [table(["model", "B", "run", "prompt", "new", "prefill ms", "ms / step",
                   "decode tokens/s", "tokens/s overall", "decode vs transformers"], rows)]


def gpu_tests(lines):
    out = []
    keys = ["tests", "passed", "failed", "skipped", "unfinished"]
    runs = [l for l in lines if l.get("summary")]
    rows = [[l["label"]] + [fmt(l[k]) for k in keys] + [fmt(l["seconds"], 1)] for l in runs]
    if len(runs) > 1:  # the shards and the multi-GPU cases
        rows.append(["all"] + [fmt(sum(l[k] for l in runs)) for k in keys] +
                    [fmt(sum(l["seconds"] for l in runs), 1)])
    if rows:
        out.append(table(["run"] + keys + ["seconds"], rows))
    odd = [l for l in lines if "test" in l and l["status"] != "passed"]
    if odd:
        out.append(table(["test", "status", "ms"],
                         [[l["test"], l["status"], fmt(l["ms"])] for l in odd]))
    return out


def profile(lines):
    out = []
    phases = [l for l in lines if "phases_ms" in l]
    if phases:
        names = list(dict.fromkeys(p for l in phases for p in l["phases_ms"]))
        rows = [[p] + [fmt(l["phases_ms"].get(p)) for l in phases] for p in names]
        rows.append(["total"] + [fmt(sum(l["phases_ms"].values())) for l in phases])
        rows.append(["graph-replayed step"] + [fmt(l.get("step_ms")) for l in phases])
        out.append(table(["phase (ms, eager, one stream)"] + [l["label"] for l in phases], rows))
    fam = [l for l in lines if "family" in l]
    if fam:
        runs = list(dict.fromkeys(l["label"] for l in fam))
        names = list(dict.fromkeys(l["family"] for l in fam))
        by = {(l["label"], l["family"]): l for l in fam}
        rows = [[f] + [f"{fmt(by[(r, f)]['ms'])} ({pct(by[(r, f)]['share'])})"
                       if (r, f) in by else "" for r in runs] for f in names]
        totals = {l["label"]: l for l in lines if "kernels" in l and "family" not in l}
        rows.append(["all kernels"] + [f"{fmt(totals[r]['ms'])} ({totals[r]['kernels']} kernels)"
                                       if r in totals else "" for r in runs])
        out.append(table(["kernel family (ms, ncu, serialised)"] + runs, rows))
    kernels = [l for l in lines if "kernel" in l]
    for run in dict.fromkeys(l["label"] for l in kernels):
        out.append(table([f"longest kernels, {run}", "grid", "calls", "ms"],
                         [[l["kernel"], l["grid"], fmt(l["calls"]), fmt(l["ms"], 3)]
                          for l in kernels if l["label"] == run]))
    power = [l for l in lines if "power_w_max" in l]
    if power:
        out.append(table(["run", "samples", "power W", "SM clock MHz"],
                         [[l["label"], fmt(l["samples"]),
                           f"{l['power_w_min']:.0f}-{l['power_w_max']:.0f}",
                           f"{l['sm_mhz_min']:.0f}-{l['sm_mhz_max']:.0f}"] for l in power]))
    return out


SUITES = {"single-gpu": single_gpu, "llama": llama, "multi-gpu": multi_gpu,
          "llama-dp": llama_dp, "nodes": multi_gpu, "llama-fsdp": llama_fsdp,
          "fp8-accuracy": fp8_accuracy, "llama-train": llama_train,
          "generation": generation, "gpu-tests": gpu_tests, "profile": profile}


def render(lines):
    by_suite = collections.defaultdict(list)
    for l in lines:
        by_suite[l.get("suite", "?")].append(l)
    out = []
    for suite, ls in by_suite.items():
        out.append(f"### {suite}")
        d = devices(ls)
        if d:
            out.append(d)
        rest = [l for l in ls if "error" not in l]
        out += SUITES[suite](rest) if suite in SUITES else [f"(no table for suite '{suite}')"]
        errors = [l for l in ls if "error" in l]
        if errors:
            out.append("\n".join(f"- {l.get('label', '?')}: {l['error']}" for l in errors))
    return "\n\n".join(out) + "\n"


def main(argv):
    texts = [open(p).read() for p in argv[1:]] or [sys.stdin.read()]
    lines = []
    for text in texts:
        for n, raw in enumerate(text.splitlines(), 1):
            raw = raw.strip()
            if not raw.startswith("{"):
                continue
            try:
                lines.append(json.loads(raw))
            except json.JSONDecodeError as e:
                sys.exit(f"suite_table.py: line {n}: {e.msg}: {raw[:80]}")
    sys.stdout.write(render(lines))


if __name__ == "__main__":
    main(sys.argv)
