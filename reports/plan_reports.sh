#!/usr/bin/env bash
# Writes the example plan search and comparison reports (reports/plans/*.html) from the
# configs in configs/plans/ and configs/models/ with the shardsim given (default
# build/shardsim). About a minute on 2 cores. The pages hold wall times, so they differ from
# run to run in those figures only.
set -euo pipefail
cd "$(dirname "$0")/.."
shardsim="${1:-build/shardsim}"
out=reports/plans
mkdir -p "$out"
for config in configs/plans/*.yaml; do
  name="$(basename "$config" .yaml)"
  "$shardsim" plan "$config" --jobs 2 --report "$out/$name.html" > "$out/$name.txt"
done
"$shardsim" compare configs/models/llama3_70b_v5p.yaml configs/models/llama3_70b_v5p_searched.yaml \
  --report "$out/compare_llama3_70b_v5p.html" > "$out/compare_llama3_70b_v5p.txt"
