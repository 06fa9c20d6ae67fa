#!/usr/bin/env bash
# deploy/k8s validated offline: `kubectl kustomize` renders the base, then k8s_validate.mjs checks
# every object against the Kubernetes schemas (npm kubernetes-models, fetched by setup.sh into
# $FORGE_DATA_DIR/npm) plus the prometheus-operator objects and cross-references by hand.
# Exit 77 (skip) when kubectl or node is missing.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
modules=${FORGE_DATA_DIR:-$root/.forge-data}/npm/node_modules
for b in kubectl node; do
  command -v "$b" >/dev/null 2>&1 || { echo "k8s_validate: $b not found: skipped"; exit 77; }
done
if [ ! -f "$modules/kubernetes-models/package.json" ] || [ ! -d "$modules/js-yaml" ]; then
  echo "k8s_validate: npm kubernetes-models / js-yaml missing under $modules (./setup.sh build fetches them)"
  exit 1
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT
kubectl kustomize "$root/deploy/k8s" > "$out"
echo "kubectl kustomize deploy/k8s: $(grep -c '^kind:' "$out") objects"
node "$root/tests/deploy/k8s_validate.mjs" "$out" "$modules" \
  "$root/deploy/grafana/dashboards/forge-training.json"
