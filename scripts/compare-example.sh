#!/usr/bin/env bash
# Regenerates an example report committed in docs/, trained on the CPU:
#   quickstart (default): configs/quickstart.yaml on Moby-Dick (prepared into data/moby-dick/
#     first) in fp32, bf16, fp8 (current scaling) and the schedule fp8-then-bf16 (fp8:current for 90% of
#     the steps, then bf16), with --int8-eval, into docs/compare-quickstart/, with the
#     Chromium test's screenshots of report.html at 1400 and 420 px beside it;
#   synthetic: configs/synthetic.yaml in fp32, bf16, fp8 (delayed) and the schedule bf16-then-fp8 (bf16
#     for 10% of the steps, then fp8:current) into docs/compare-synthetic/;
#   text-small: configs/text-small.yaml on the State of the Union addresses (prepared into
#     data/sotu/ first) in fp32, bf16 and fp8 (delayed) into docs/compare-text-small/.
# The runs stay in build/compare-example-NAME/runs (the report's "Runs" section names them), so a
# second call reuses them and only rewrites the report. The committed report is replaced only
# when the compare succeeded.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
which="${1:-quickstart}"
extra=""
cache="${PTRAIN_CACHE:-$HOME/.cache/ptrain}"
prepare() {  # DIR INPUT TOKENIZER VAL_FRACTION
  if [ ! -f "$1/ptrain-tokenizer.json" ]; then
    rm -rf "$1"
    ./build/ptrain data prepare --input "$2" --out "$1" --tokenizer "$3" --val-fraction "$4"
  fi
}
case "$which" in
  quickstart)
    config=configs/quickstart.yaml modes=fp32,bf16,fp8:current,schedule:fp8-then-bf16 extra=--int8-eval
    prepare data/moby-dick "$cache/text/moby-dick.txt" bytes 0.1 ;;
  synthetic) config=configs/synthetic.yaml modes=fp32,bf16,fp8:delayed,schedule:bf16-then-fp8 ;;
  text-small)
    config=configs/text-small.yaml modes=fp32,bf16,fp8:delayed
    prepare data/sotu "$cache/text/sotu" gpt2 0.05 ;;
  *) echo "usage: $0 [quickstart|synthetic|text-small]" >&2; exit 2 ;;
esac
work="build/compare-example-$which"
out="docs/compare-$which"
# --force: a second call replaces the report of the first (its runs are reused).
./build/ptrain compare "$config" --modes "$modes" --out "$work" --set run.device=cpu --force $extra
shots="build/compare-example-$which-screenshots"  # beside the compare directory, which holds only its own files
rm -rf "$shots"
[ "$which" = quickstart ] && ./tests/report_in_chromium.sh build/ptrain "$work" "$shots"
rm -rf "$out"
mkdir -p "$out"
cp "$work"/report.md "$work"/report.html "$work"/*.svg "$out"/
[ -d "$shots" ] && cp "$shots"/*.png "$out"/
echo "wrote $out"
