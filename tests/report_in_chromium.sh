#!/usr/bin/env bash
# Opens a `ptrain compare` HTML report in headless Chromium (Debian's `chromium`): it must load
# with no request leaving the file, render the four inline charts and the table into the DOM, and
# give a non-empty screenshot. Without Chromium the test reports "skipped" (exit 77), never passed.
# Usage: report_in_chromium.sh PTRAIN_BINARY
set -euo pipefail
ptrain="$1"
browser="$(command -v chromium || command -v chromium-browser || true)"
if [ -z "$browser" ]; then
  echo "skipped: Chromium is not installed (apt-get install chromium)"
  exit 77
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
cat > tiny.yaml <<'YAML'
run: {name: tiny, out_dir: runs, seed: 3, device: cpu}
model: {n_layer: 2, n_head: 4, n_embd: 64, seq_len: 32, vocab_size: 64}
data: {synthetic: {vocab: 64, order: 2, branching: 4, tokens: 60000, seed: 5}}
training: {steps: 4, batch_tokens: 256, micro_batch: 8, eval_every: 2, eval_batches: 2, threads: 1}
checkpoint: {save_final: false}
YAML
"$ptrain" compare tiny.yaml --modes fp32,bf16 --out report >compare.log 2>&1 || { cat compare.log; exit 1; }

chrome=("$browser" --headless --no-sandbox --disable-gpu --user-data-dir="$work/profile" --no-first-run
        --enable-logging=stderr --v=0 --window-size=1280,2400)
"${chrome[@]}" --dump-dom "file://$work/report/report.html" >dom.html 2>dom.log || { cat dom.log; exit 1; }
"${chrome[@]}" --screenshot="$work/shot.png" "file://$work/report/report.html" >shot.log 2>&1 || { cat shot.log; exit 1; }

fail() { echo "FAIL: $*"; exit 1; }
[ "$(grep -o '<svg' dom.html | wc -l)" -eq 4 ] || fail "the rendered DOM does not hold the 4 charts"
grep -q '<table' dom.html || fail "the rendered DOM has no table"
grep -q 'data-mode="bf16"' dom.html || fail "the charts have no bf16 curve"
# Page errors Chromium logs: JavaScript exceptions, resources that failed to load, network requests.
if grep -E "Uncaught|Failed to load resource|ERR_(FILE|NAME|CONNECTION|INTERNET)" dom.log shot.log; then
  fail "Chromium reported errors loading the report"
fi
[ -s shot.png ] || fail "no screenshot"
[ "$(head -c 8 shot.png | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] || fail "the screenshot is not a PNG"
[ "$(stat -c %s shot.png)" -gt 20000 ] || fail "the screenshot is nearly empty ($(stat -c %s shot.png) bytes)"
echo "report.html rendered in $("$browser" --version 2>/dev/null | head -1): 4 charts, table, screenshot $(stat -c %s shot.png) bytes"
