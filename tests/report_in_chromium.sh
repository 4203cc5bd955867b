#!/usr/bin/env bash
# Opens a `ptrain compare` HTML report in headless Chromium (Debian's `chromium`) at 1400 px and
# at a phone's 420 px (tests/report_layout.js): it must load with no request leaving the file,
# render the five inline charts, both tables and the verdict, fit the width (no horizontal scroll
# of the page; at 1400 px the tables fit without scrolling inside their boxes either), and give a
# full-page screenshot at each width. Without Chromium the test reports "skipped" (exit 77), never passed,
# unless PTRAIN_REQUIRE_CHROMIUM=1 (scripts/test.sh, whose install step provides it): then its
# absence is a failure.
# Usage: report_in_chromium.sh PTRAIN_BINARY [REPORT_DIR SCREENSHOT_DIR]
#   Without REPORT_DIR it checks the report of a tiny compare it runs itself; with them it checks
#   REPORT_DIR/report.html and keeps the screenshots as SCREENSHOT_DIR/report-1400px.png and
#   report-420px.png.
set -euo pipefail
ptrain="$1"
report_dir="${2:-}"
shot_dir="${3:-}"
browser="$(command -v chromium || command -v chromium-browser || true)"
if [ -z "$browser" ]; then
  if [ "${PTRAIN_REQUIRE_CHROMIUM:-0}" = 1 ]; then
    echo "FAIL: Chromium is not installed, but scripts/install-deps.sh was meant to install it (package chromium)"
    exit 1
  fi
  echo "skipped: Chromium is not installed (apt-get install chromium)"
  exit 77
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

if [ -z "$report_dir" ]; then
  cat > "$work/tiny.yaml" <<'YAML'
run: {name: tiny, out_dir: runs, seed: 3, device: cpu}
model: {n_layer: 2, n_head: 4, n_embd: 64, seq_len: 32, vocab_size: 64}
data: {synthetic: {vocab: 64, order: 2, branching: 4, tokens: 60000, seed: 5}}
training: {steps: 8, batch_tokens: 256, micro_batch: 8, eval_every: 2, eval_batches: 2, threads: 1}
checkpoint: {save_final: false}
YAML
  (cd "$work" && "$ptrain" compare tiny.yaml --modes fp32,bf16,fp8:current --out report >compare.log 2>&1) ||
    { cat "$work/compare.log"; exit 1; }
  report_dir="$work/report"
  shot_dir="$work"
fi
[ -f "$report_dir/report.html" ] || fail "no $report_dir/report.html"
mkdir -p "$shot_dir"

node "$(dirname "$0")/report_layout.js" "$browser" "$report_dir/report.html" "$shot_dir"
for width in 1400 420; do
  shot="$shot_dir/report-${width}px.png"
  [ "$(head -c 8 "$shot" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || fail "the $width px screenshot is not a PNG"
  [ "$(stat -c %s "$shot")" -gt 20000 ] || fail "the $width px screenshot is nearly empty ($(stat -c %s "$shot") bytes)"
done
