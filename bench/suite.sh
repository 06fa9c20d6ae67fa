#!/bin/bash
# The benchmark harness: runs one named suite on the GPU machine, prints its results as JSON
# lines (one per run, each tagged "suite" and "label"), then a markdown table made from them
# (bench/suite_table.py). docs/performance.md's tables come from these suites.
#
#   bench/suite.sh [--dry-run] [--out DIR] [--base] [--no-anchor] [--world N] [--as-shipped]
#                  [--filter GTEST_FILTER] [--data TAR_OR_DIR] [--deadline SECONDS]
#                  [--only REGEX] SUITE
#   bench/suite.sh --list
#
# Suites (each sized for one device call of at most 10 minutes):
#   single-gpu    forge-bench gpt350m B 16 and 24 and gpt124m B 16 in BF16, gpt350m in FP8 and
#                 FP8 with the FP8 LM head (--steps 30, CUDA graph replay), then the compiled
#                 PyTorch anchor (torch_baseline.py) for the same shapes on the same GPU
#   llama         forge-bench llama3-1b (T 8192) B 2 on one GPU in BF16 with activation recompute
#                 none, selective and full, and in FP8 (--steps 10); then torch_llama.py (FSDP2
#                 recipe: per-block compile, flash SDPA with GQA) llama1b B 2 with checkpointing
#                 none and full on the same GPU
#   multi-gpu     forge-dist-bench gpt350m B 16 per GPU on N GPUs: ddp (fp32 and bf16 gradient
#                 collectives, the copy engines), zero1, zero2, fsdp, ddp and fsdp in FP8, and
#                 ddp with distinct batches and the one-GPU accumulation check; then
#                 torch_dist.py ddp and fsdp on the same GPUs
#   llama-dp      forge-dist-bench llama3-1b (T 8192) B 2 per GPU on N GPUs with fsdp and ddp,
#                 each against one GPU measured first (its share of one GPU's speed); then
#                 torch_llama.py llama1b B 2 without checkpointing on the same GPUs
#   nodes         forge-dist-bench gpt350m B 16 per GPU on N GPUs (an even number) as one node
#                 and as 2 emulated nodes (NCCL's socket transport between them): ddp with bf16
#                 gradients, fsdp, and hsdp with shard groups of a node's N/2 GPUs
#   llama-fsdp    forge-dist-bench llama3-8b (T 8192) fsdp B 1 per GPU on N GPUs (it does not
#                 fit one: --no-single) beside torch_llama.py llama8b B 1 on the same GPUs:
#                 without recompute BF16, FP8 and the recipe's none; then selective BF16; full
#                 BF16, FP8 and the recipe's full; FP8 with the bf16 gather (--fp8-gather off)
#   fp8-accuracy  gpt124m on the real corpus from the same init and data, BF16 and FP8 + FP8 LM
#                 head: 2000 steps, global batch 16, validation every 100 steps (--as-shipped:
#                 the config's global batch 32 and validation every 250); two GPUs side by side
#                 where there are two
#   llama-train   each Llama preset's shipped config trains on real text in the llama3
#                 tokenizer's ids, one micro-step a step, warm-up 30 steps, validation every 100:
#                 llama3-1b and llama3-3b 300 steps on one GPU each (side by side where there are
#                 two), then llama3-8b 200 steps with fsdp over the GPUs (2 or more)
#   generation    forge-generate-bench: greedy generation tokens/s at gpt350m and llama3-1b
#                 shapes, batch 1 and 32 (prompt 128, 128 new tokens); then the transformers
#                 anchor (bench/hf_generate_anchor.py: generate with a static KV cache) on the
#                 same shapes
#   gpu-tests     the GPU test binary (forge_gpu_tests): on several GPUs its one-GPU cases in
#                 gtest shards side by side, a GPU each, then its multi-GPU cases over all GPUs
#   profile       where gpt350m B 16's step goes, BF16 and FP8 + FP8 LM head: forge-bench
#                 --profile (phases of an eager single-stream step), ncu of one eager step
#                 (kernel times by family, the longest kernels), and power and SM clock under
#                 nvidia-smi dmon during 200 graph-replayed steps
#
# Exit status: 0 when every run gave its lines (and every test passed), 1 otherwise, 2 on a
# usage error.
#
# Options: --dry-run prints the commands instead of running them (no GPU needed); --out DIR: where
# SUITE.jsonl, SUITE.md and SUITE-logs.tar.gz (every run's log and files) go (default $OUT, else
# /tmp/forge-suite); --base also runs the previous build's benchmark (bin/forge-bench-base,
# bin/forge-dist-bench-base: copy them there after packing) right before the new one on every row;
# --no-anchor leaves the PyTorch runs out; --world N: GPUs for multi-gpu, llama-dp, nodes,
# llama-fsdp, llama-train and gpu-tests (default: all); --filter: a gtest filter for gpu-tests;
# --data: the prepared dataset for fp8-accuracy or llama-train, a directory holding dataset/ or a
# .tar.xz of it (default .devdata/full.tar.xz, .devdata/llama3.tar.xz; how to make them:
# docs/performance.md); --deadline: no run starts after this many seconds (default 560, so a suite
# ends inside one 10-minute device call; a skipped run leaves an error line); --only: only the runs
# whose label (the JSON lines' "label"; --dry-run shows them) matches the bash regex, e.g. to split
# a suite over two calls.
#
# Environment (paths only): FORGE_DEVICE_DIR, the packed binaries (bin/, run: the wrapper
# ../shared/device/pack writes) and the anchors copied beside them (default .device).
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 2

suites="single-gpu llama multi-gpu llama-dp nodes llama-fsdp fp8-accuracy llama-train"
suites+=" generation gpu-tests profile"
header() { sed -n '2,/^[^#]/p' "$0" | sed -n 's/^# \{0,1\}//p'; }
usage() {
  echo "usage:" >&2
  header | sed -n '/^  *bench\/suite.sh/,/--list/p' >&2
  echo "suites: $suites" >&2
  exit 2
}

dry=false base=false anchor=true shipped=false world="" filter="" only="" deadline=560
data="" out=${OUT:-/tmp/forge-suite} suite=""
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry=true ;;
    --base) base=true ;;
    --no-anchor) anchor=false ;;
    --as-shipped) shipped=true ;;
    --out) out=${2:?--out needs a directory}; shift ;;
    --world) world=${2:?--world needs a number}; shift ;;
    --filter) filter=${2:?--filter needs a gtest filter}; shift ;;
    --data) data=${2:?--data needs a path}; shift ;;
    --deadline) deadline=${2:?--deadline needs seconds}; shift ;;
    --only) only=${2:?--only needs a regex}; shift ;;
    --list) echo "$suites"; exit 0 ;;
    -h|--help) header; exit 0 ;;
    -*) echo "suite.sh: unknown option $1" >&2; usage ;;
    *) [ -z "$suite" ] || { echo "suite.sh: one suite at a time" >&2; usage; }; suite=$1 ;;
  esac
  shift
done
[ -n "$suite" ] || usage
case " $suites " in *" $suite "*) ;; *) echo "suite.sh: unknown suite '$suite'" >&2; usage ;; esac
[[ $world =~ ^[0-9]*$ ]] || { echo "suite.sh: --world takes a GPU count" >&2; exit 2; }
[[ $deadline =~ ^[0-9]+$ ]] || { echo "suite.sh: --deadline takes seconds" >&2; exit 2; }

dev=${FORGE_DEVICE_DIR:-.device}
run=$dev/run
py=python3
[ -x /opt/torch/.venv/bin/python3 ] && /opt/torch/.venv/bin/python3 -c 'import torch' 2>/dev/null &&
  py=/opt/torch/.venv/bin/python3
lines="python3 bench/suite_lines.py"
# PyTorch's launcher for the anchors on several GPUs, after `env` and any variables of the run's
# own (then --nproc_per_node and the script): NVLink multicast off, as .device/run has it for
# Forge (required on shared hosts).
torchrun=(NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1 "$py" -m
          torch.distributed.run --standalone)
# $out keeps SUITE.jsonl, SUITE.md and SUITE-logs.tar.gz (made from $work at the end: each run's
# log, the configs, training runs, ncu and dmon files); three files, so they all come back from
# a device call.
work=$out/$suite-logs
mkdir -p "$out"
$dry || { rm -rf "$work" && mkdir -p "$work"; }
jsonl=$out/$suite.jsonl
$dry || : > "$jsonl"

# Appends JSON lines from stdin to the suite's file and prints them.
keep() { tee -a "$jsonl"; }
# Tags a program's JSON lines with the suite and LABEL.
tag() { sed -n "s|^{|{\"suite\":\"$suite\",\"label\":\"$1\",|p"; }
note() { echo "{\"suite\":\"$suite\",\"label\":\"$1\",\"error\":\"$2\"}" | keep; }
# The command as one shell line: words with spaces or shell characters in single quotes.
show() {
  local a line=""
  for a in "$@"; do
    if [[ $a =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then line+=" $a"; else line+=" '${a//\'/\'\\\'\'}'"; fi
  done
  echo "${line# }"
}

# hard SECONDS COMMAND...: the command under a time limit, killed outright when it runs over;
# then waits (up to 60 s) until no process is left on the GPU, so a hung kernel cannot stall
# the runs after it.
hard() {
  local s=$1
  shift
  timeout -s KILL "$s" "$@"
  local rc=$?
  for _ in $(seq 60); do
    [ -z "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null)" ] && break
    sleep 1
  done
  return $rc
}

# step LABEL SECONDS COMMAND...: one run. Its output goes to $work/LABEL.log, its JSON lines
# (tagged) to stdout and the suite's file; a run that fails or times out leaves an error line.
# With --dry-run: the command only. Runs after the deadline are skipped (an error line too).
step() {
  local label=$1 secs=$2
  shift 2
  [ -z "$only" ] || [[ $label =~ $only ]] || return 0
  if $dry; then echo "# $label"; show "$@"; return 0; fi
  if [ "$SECONDS" -ge "$deadline" ]; then
    note "$label" "skipped: the call's time is spent"
    return 1
  fi
  echo "suite.sh: $label" >&2
  hard "$secs" "$@" > "$work/$label.log" 2>&1
  local rc=$?
  grep '^{' "$work/$label.log" | tag "$label" | keep
  [ $rc = 0 ] || note "$label" "exit $rc$([ $rc = 137 ] && echo ": killed at the ${secs} s limit")"
  return $rc
}

gpu_line() {
  # shellcheck disable=SC2054  # commas inside the flags, not between elements
  local q=(--query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader,nounits)
  $dry && { show nvidia-smi "${q[@]}"; return; }
  nvidia-smi "${q[@]}" |
    $lines gpus --suite "$suite" | keep
}

# forge-bench with BIN (forge-bench or forge-bench-base) on CONFIG at micro-batch B.
bench_row() {  # LABEL BIN MODEL B [flags]
  local label=$1 bin=$2 model=$3 b=$4
  shift 4
  step "$label" 120 "$run" "$bin" --config "configs/$model.yaml" --micro-batch "$b" --steps 30 "$@"
}

single_gpu() {
  gpu_line
  local rows=(
    "gpt350m 16 bf16 --precision bf16"
    "gpt350m 24 bf16 --precision bf16"
    "gpt124m 16 bf16 --precision bf16"
    "gpt350m 16 fp8 --precision fp8 --fp8-lm-head 0"
    "gpt350m 16 fp8lm --precision fp8 --fp8-lm-head 1"
    "gpt350m 24 fp8lm --precision fp8 --fp8-lm-head 1"
  )
  local r model b p
  for r in "${rows[@]}"; do
    # shellcheck disable=SC2086
    set -- $r
    model=$1 b=$2 p=$3
    shift 3
    if $base; then bench_row "$model-b$b-$p-base" forge-bench-base "$model" "$b" "$@"; fi
    bench_row "$model-b$b-$p" forge-bench "$model" "$b" "$@"
  done
  $anchor && step torch $((deadline - SECONDS > 60 ? deadline - SECONDS : 60)) \
    env PYTHONUNBUFFERED=1 "$py" "$dev/torch_baseline.py" gpt350m:16:c gpt350m:24:c gpt124m:16:c
}

llama() {
  gpu_line
  local r p bin
  for r in bf16-none bf16-selective bf16-full fp8-none; do
    p=${r%-*}
    for bin in forge-bench-base forge-bench; do
      [ "$bin" = forge-bench ] || $base || continue
      step "llama3-1b-b2-$r${bin#forge-bench}" 150 "$run" "$bin" --config configs/llama3-1b.yaml \
        --micro-batch 2 --steps 10 --precision "$p" --recompute "${r#*-}"
    done
  done
  if $anchor; then
    for r in none full; do
      step "torch-llama1b-b2-$r" 240 env STEPS=10 PYTHONUNBUFFERED=1 "$py" -m \
        torch.distributed.run --standalone --nproc_per_node=1 "$dev/torch_llama.py" llama1b 2 8192 \
        "ac=$r"
    done
  fi
}

# The GPUs of a multi-GPU suite: --world, else every GPU of the machine (4 in a dry run); 2 at
# least, or the suite ($1) cannot run.
multi_world() {
  local w=$world
  if [ -z "$w" ]; then
    if $dry; then w=4; else w=$(nvidia-smi -L | wc -l); fi
  fi
  [ "$w" -ge 2 ] || { echo "suite.sh: $1 needs 2 or more GPUs (found $w)" >&2; exit 1; }
  echo "$w"
}

# llama3-1b over the GPUs of one host, each mode against one GPU (forge-dist-bench measures
# the single-GPU step first): the share of one GPU's speed the Llama targets ask of fsdp.
llama_dp() {
  local w m
  w=$(multi_world llama-dp) || exit 1
  gpu_line
  for m in fsdp ddp; do
    step "llama3-1b-$m-w$w" 180 "$run" forge-dist-bench --config configs/llama3-1b.yaml \
      --world "$w" --mode "$m" --micro-batch 2 --steps 6 --warmup 2
  done
  $anchor || return 0
  step "torch-llama1b-b2-none-w$w" 240 env STEPS=10 "${torchrun[@]}" --nproc_per_node="$w" \
    "$dev/torch_llama.py" llama1b 2 8192 ac=none
}

# The GPUs as one node and as two emulated ones (forge-dist-bench --emulate-nodes: each rank
# its own NCCL host id, so the bytes between the halves go over NCCL's network transport).
nodes() {
  local w
  w=$(multi_world nodes) || exit 1
  if [ $((w % 2)) != 0 ]; then
    echo "suite.sh: nodes needs an even number of GPUs (got $w)" >&2
    exit 1
  fi
  gpu_line
  local g=$((w / 2)) r n
  local rows=(
    "ddp-bf16 --mode ddp --grad-reduce bf16"
    "fsdp --mode fsdp"
    "hsdp-g$g --mode hsdp --shard-group-size $g"
  )
  for n in 1 2; do
    for r in "${rows[@]}"; do
      # shellcheck disable=SC2086
      set -- $r
      local label=$1
      shift
      local topo=()
      [ "$n" = 2 ] && topo=(--emulate-nodes 2)
      step "$label-w$w-nodes$n" 150 "$run" forge-dist-bench --config configs/gpt350m.yaml \
        --world "$w" --micro-batch 16 --steps 20 "$@" "${topo[@]}"
    done
  done
}

llama_fsdp() {
  local w
  w=$(multi_world llama-fsdp) || exit 1
  gpu_line
  local common=(--config configs/llama3-8b.yaml --world "$w" --mode fsdp --micro-batch 1
                --steps 4 --warmup 2 --no-single)
  # Most wanted first (a call's deadline skips the tail): no recompute, the recipe's fastest
  # setting and the targets' reference, then selective and full.
  forge8b() {  # RECOMPUTE PRECISION [flags]
    local r=$1 p=$2 extra=""
    shift 2
    [ $# -gt 0 ] && extra=-bf16gather
    step "llama3-8b-fsdp-$p$extra-$r-w$w" 150 "$run" forge-dist-bench "${common[@]}" \
      --recompute "$r" --precision "$p" "$@"
  }
  torch8b() {  # AC
    $anchor || return 0
    step "torch-llama8b-b1-$1-w$w" 150 env STEPS=6 "${torchrun[@]}" --nproc_per_node="$w" \
      "$dev/torch_llama.py" llama8b 1 8192 "ac=$1"
  }
  forge8b none bf16
  forge8b none fp8
  torch8b none
  forge8b selective bf16
  forge8b full bf16
  forge8b full fp8
  torch8b full
  forge8b full fp8 --fp8-gather off
}

multi_gpu() {
  local w
  w=$(multi_world multi-gpu) || exit 1
  gpu_line
  local rows=(
    "ddp --mode ddp"
    "ddp-bf16 --mode ddp --grad-reduce bf16"
    "ddp-ce --mode ddp --ddp-allreduce copy_engine"
    "zero1 --mode zero1"
    "zero2 --mode zero2"
    "fsdp --mode fsdp"
    "ddp-fp8 --mode ddp --precision fp8"
    "fsdp-fp8 --mode fsdp --precision fp8"
    "ddp-accum-check --mode ddp --distinct-batches --accum-check"
  )
  local r label
  for r in "${rows[@]}"; do
    # shellcheck disable=SC2086
    set -- $r
    label=$1
    shift
    local args=(--config configs/gpt350m.yaml --world "$w" --micro-batch 16 --steps 20 "$@")
    if $base; then step "$label-w$w-base" 150 "$run" forge-dist-bench-base "${args[@]}"; fi
    step "$label-w$w" 150 "$run" forge-dist-bench "${args[@]}"
  done
  if $anchor; then
    local m
    for m in ddp fsdp; do
      step "torch-$m-w$w" 200 env "${torchrun[@]}" --nproc_per_node="$w" "$dev/torch_dist.py" \
        "$m" gpt350m 16
    done
  fi
}

# The directory holding the suite's dataset/ (FORGE_DATA_DIR for its runs) into $fd: --data, else
# DEFAULT; a .tar.xz is unpacked under /tmp.
unpack_data() {  # DEFAULT
  local d=${data:-$1}
  fd=/tmp/forge-suite-data
  if $dry; then
    show tar -xJf "$d" -C "$fd"
  elif [ -d "$d/dataset" ]; then
    fd=$d
  else
    [ -f "$d" ] || { echo "suite.sh: no dataset at $d (docs/performance.md)" >&2; exit 1; }
    rm -rf "$fd" && mkdir -p "$fd" && tar -xJf "$d" -C "$fd"
  fi
}

# One `forge train` run: $work/PREFIX_NAME.yaml on GPUS with the suite's dataset ($fd), no
# checkpoints; its validation losses and summary as lines labelled NAME.
train_row() {  # PREFIX NAME GPUS SECONDS [flags]
  local p=$1 name=$2 gpus=$3 secs=$4 dir=$work/$1_$2
  shift 4
  $dry || rm -rf "$dir"
  step "$p-$name" "$secs" env FORGE_DATA_DIR="$fd" CUDA_VISIBLE_DEVICES="$gpus" "$run" \
    forge train "$work/${p}_$name.yaml" "$@" --checkpoint-every 0 --run-dir "$dir"
  $dry && return 0
  $lines train "$dir/metrics.jsonl" "$work/$p-$name.log" --suite "$suite" --label "$name" | keep
}

# Two train_rows of one GPU each, A on GPU 0 and B on GPU 1 side by side where there are two
# (NGPU), else one after the other on GPU 0; A's lines first. A dry run shows the GPUs.
side_by_side() {  # NGPU PREFIX A B SECONDS [flags]
  local n=$1 p=$2 a=$3 b=$4 g=0
  shift 4
  [ "$n" -ge 2 ] && g=1
  if [ $g = 1 ] && ! $dry; then
    train_row "$p" "$a" 0 "$@" > "$work/$p-$a.lines" &
    train_row "$p" "$b" 1 "$@"
    wait
    cat "$work/$p-$a.lines"
  else
    train_row "$p" "$a" 0 "$@"
    train_row "$p" "$b" $g "$@"
  fi
}

fp8_accuracy() {
  local fd
  unpack_data .devdata/full.tar.xz
  gpu_line
  # The shipped gpt124m config with only its precision changed (and, unless --as-shipped, the
  # global batch 16 and validation every 100 steps of the accuracy record).
  local sets=() name
  $shipped ||
    sets=(-e "s/global_batch: 32/global_batch: 16/" -e "s/every_steps: 250/every_steps: 100/")
  for name in bf16 fp8lm; do
    local compute=bf16 lm=false
    [ $name = fp8lm ] && compute=fp8 lm=true
    local cfg=$work/acc_$name.yaml
    if $dry; then
      echo "$(show sed -e "s/compute: bf16/compute: $compute\\n  fp8:\\n    lm_head: $lm/" \
        "${sets[@]}" configs/gpt124m.yaml) > $cfg"
    else
      sed -e "s/compute: bf16/compute: $compute\n  fp8:\n    lm_head: $lm/" "${sets[@]}" \
        configs/gpt124m.yaml > "$cfg"
    fi
  done
  local ngpu=1
  $dry || ngpu=$(nvidia-smi -L | wc -l)
  side_by_side "$ngpu" acc bf16 fp8lm 420 --direct
}

generation() {
  gpu_line
  local m
  for m in gpt350m llama3-1b; do
    step "generate-$m" 150 "$run" forge-generate-bench --model "$m" --batch 1,32 \
      --prompt-len 128 --new-tokens 128
  done
  if $anchor; then
    for m in gpt350m llama3-1b; do
      step "transformers-$m" 240 env PYTHONUNBUFFERED=1 "$py" bench/hf_generate_anchor.py \
        --model "$m" --batch 1,32 --prompt-len 128 --new-tokens 128
    done
  fi
}

# The GPU tests whose cases span several GPUs (ranks over NCCL, or as threads with host
# collectives, and the copy-engine, elastic and worker-kill tests); every other case needs one.
multi_gpu_tests='CudaDataParallel.*:Modes/CudaDataParallelTest.*:Modes/GpuDataParallelResume.*'
multi_gpu_tests+=':NcclComm.*:NcclCommTiming.*:CudaBackendCommTiming.*:CopyEngine*:GpuElastic.*'
multi_gpu_tests+=':GpuWorkerKill.*'

gpu_tests() {
  gpu_line
  local n i label labels=()
  if $dry; then n=${world:-2}; else n=${world:-$(nvidia-smi -L | wc -l)}; fi
  if [ -n "$filter" ] || [ "$n" -lt 2 ]; then
    local args=()
    [ -n "$filter" ] && args+=(--gtest_filter="$filter")
    step gpu-tests-run 540 "$run" forge_gpu_tests "${args[@]}"
    labels=(gpu-tests-run)
  else
    # Several GPUs: the one-GPU cases in n gtest shards side by side, a GPU each, then the
    # cases of several GPUs over all of them (the whole binary fits one call on 2 or 4 GPUs).
    for ((i = 0; i < n; i++)); do
      step "gpu-tests-shard$i" 300 env CUDA_VISIBLE_DEVICES="$i" GTEST_TOTAL_SHARDS="$n" \
        GTEST_SHARD_INDEX="$i" "$run" forge_gpu_tests --gtest_filter="-$multi_gpu_tests" &
      labels+=("gpu-tests-shard$i")
    done
    wait
    step gpu-tests-multi 240 "$run" forge_gpu_tests --gtest_filter="$multi_gpu_tests"
    labels+=(gpu-tests-multi)
  fi
  $dry && return
  for label in "${labels[@]}"; do
    $lines gtest "$work/$label.log" --suite "$suite" --label "$label" | keep
  done
}

profile() {
  gpu_line
  local p flags
  for p in bf16 fp8lm; do
    flags=(--precision bf16)
    [ $p = fp8lm ] && flags=(--precision fp8 --fp8-lm-head 1)
    step "phases-$p" 120 "$run" forge-bench --config configs/gpt350m.yaml --micro-batch 16 \
      --profile "${flags[@]}"
    # Every kernel of one eager step (no graph, one stream), clocks and caches left alone.
    step "ncu-$p" 240 "$run" ncu --clock-control none --cache-control none \
      --metrics gpu__time_duration.sum --csv --page raw --log-file "$work/ncu-$p.csv" \
      forge-bench --config configs/gpt350m.yaml --micro-batch 16 --warmup 1 --steps 1 \
      --cuda-graph 0 "${flags[@]}"
    $dry || $lines ncu "$work/ncu-$p.csv" --top 15 --suite "$suite" --label "ncu-$p" | keep
    # Power and SM clock once a second while the step runs graph-replayed.
    if $dry; then
      show nvidia-smi dmon -s pc -d 1
    else
      nvidia-smi dmon -s pc -d 1 > "$work/dmon-$p.txt" 2>&1 &
      local mon=$!
    fi
    step "power-$p" 120 "$run" forge-bench --config configs/gpt350m.yaml --micro-batch 16 \
      --steps 200 "${flags[@]}"
    if ! $dry; then
      kill "$mon" 2>/dev/null
      wait "$mon" 2>/dev/null
      $lines dmon "$work/dmon-$p.txt" --suite "$suite" --label "power-$p" | keep
    fi
  done
}

llama_train() {
  local fd ngpu w
  unpack_data .devdata/llama3.tar.xz
  gpu_line
  if $dry; then ngpu=${world:-4}; else ngpu=${world:-$(nvidia-smi -L | wc -l)}; fi
  # One micro-step a step (global batch = micro-batch x GPUs), a short warm-up, a cosine decay
  # over the run, validation every 100 steps on 4 batches; everything else as shipped.
  train_config() {  # MODEL GLOBAL_BATCH STEPS
    local cfg=$work/train_$1.yaml
    local e=(-e "s/global_batch: 32/global_batch: $2/" -e "s/warmup_steps: 200/warmup_steps: 30/"
             -e "s/total_steps: 5000/total_steps: $3/" -e "s/every_steps: 250/every_steps: 100/"
             -e "s/batches: 8/batches: 4/")
    if $dry; then echo "$(show sed "${e[@]}" "configs/$1.yaml") > $cfg"
    else sed "${e[@]}" "configs/$1.yaml" > "$cfg"; fi
  }
  train_config llama3-1b 2 300
  train_config llama3-3b 1 300
  side_by_side "$ngpu" train llama3-1b llama3-3b 240 --direct
  if [ "$ngpu" -ge 2 ]; then
    # fsdp over every GPU given: forge train starts a forge-worker on each.
    w=$ngpu
    train_config llama3-8b "$w" 200
    train_row train llama3-8b "$(seq -s, 0 $((w - 1)))" 420
  elif $dry; then
    echo "# train-llama3-8b skipped: fsdp needs 2 or more GPUs (found $ngpu)"
  else
    note train-llama3-8b "skipped: fsdp needs 2 or more GPUs (found $ngpu)"
  fi
}

case $suite in
  single-gpu) single_gpu ;;
  llama) llama ;;
  multi-gpu) multi_gpu ;;
  llama-dp) llama_dp ;;
  nodes) nodes ;;
  llama-fsdp) llama_fsdp ;;
  fp8-accuracy) fp8_accuracy ;;
  llama-train) llama_train ;;
  generation) generation ;;
  gpu-tests) gpu_tests ;;
  profile) profile ;;
esac
$dry && exit 0
echo
python3 bench/suite_table.py "$jsonl" | tee "$out/$suite.md"
tar czf "$out/$suite-logs.tar.gz" -C "$out" "$suite-logs" && rm -rf "$work"
echo "suite.sh: $suite done in ${SECONDS}s: $jsonl, $out/$suite.md, $out/$suite-logs.tar.gz" >&2
# A run that failed, timed out or was skipped, or a test that did not pass: exit 1.
! grep -q -E '"error":|"status": "(failed|unfinished)"' "$jsonl"
