#!/usr/bin/env bash
# Regenerates an example report committed in docs/: `synthetic` (default) is
# configs/synthetic.yaml into docs/compare-quickstart/ (the name it had when it was the quick
# start); `text-small` is configs/text-small.yaml on the State of the Union addresses (prepared
# into data/sotu/ first) into docs/compare-text-small/. Each is trained on the CPU in fp32, bf16
# and fp8 (delayed scaling), compared against fp32. The runs are not kept (the report's "Runs"
# section names where they were). If the compare fails, the committed report is put back.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
which="${1:-synthetic}"
case "$which" in
  synthetic) config=configs/synthetic.yaml out=docs/compare-quickstart ;;
  text-small)
    config=configs/text-small.yaml out=docs/compare-text-small
    if [ ! -f data/sotu/ptrain-tokenizer.json ]; then
      rm -rf data/sotu
      ./build/ptrain data prepare --input "${PTRAIN_CACHE:-$HOME/.cache/ptrain}/text/sotu" --out data/sotu \
        --tokenizer gpt2 --val-fraction 0.05
    fi ;;
  *) echo "usage: $0 [synthetic|text-small]" >&2; exit 2 ;;
esac
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
./build/ptrain compare "$config" --modes fp32,bf16,fp8:delayed --out "$out" --set run.device=cpu
rm -rf "$out/runs"
echo "wrote $out"
