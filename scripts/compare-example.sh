#!/usr/bin/env bash
# Regenerates the example report committed in docs/compare-quickstart/: the synthetic-corpus config
# trained on the CPU in fp32, bf16 and fp8 (delayed scaling), compared against fp32. The runs
# are not kept (the report's "Runs" section names where they were). If the compare fails, the
# committed report is put back as it was.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
out=docs/compare-quickstart
backup="$(mktemp -d)"
[ -d "$out" ] && mv "$out" "$backup/previous"
restore() {
  if [ ! -f "$out/report.md" ] && [ -d "$backup/previous" ]; then
    rm -rf "$out"
    mv "$backup/previous" "$out"
    echo "the compare failed: $out is unchanged" >&2
  fi
  rm -rf "$backup"
}
trap restore EXIT
./build/ptrain compare configs/synthetic.yaml --modes fp32,bf16,fp8:delayed --out "$out" --set run.device=cpu
rm -rf "$out/runs"
echo "wrote $out"
