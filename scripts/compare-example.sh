#!/usr/bin/env bash
# Regenerates the example report committed in docs/compare-quickstart/: the quick-start config
# trained on the CPU in fp32, bf16 and fp8 (delayed scaling), compared against fp32. The runs
# themselves are removed afterwards; the report, its charts and this script stay.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
out=docs/compare-quickstart
rm -rf "$out"
./build/ptrain compare configs/quickstart.yaml --modes fp32,bf16,fp8:delayed --out "$out" \
  --set run.device=cpu
rm -rf "$out/runs"
echo "wrote $out"
