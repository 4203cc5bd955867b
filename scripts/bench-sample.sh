#!/usr/bin/env bash
# Generation speed with and without the KV cache, side by side: `ptrain sample --timing` over a
# checkpoint, the context filled from a one-token prompt, run REPEATS times each way in turn;
# prints each run's tokens/s and the medians. Start-up (loading the checkpoint and vocabulary)
# is not counted.
#   scripts/bench-sample.sh CHECKPOINT_DIR [REPEATS=5] [PROMPT=C]
set -euo pipefail
checkpoint=${1:?usage: scripts/bench-sample.sh CHECKPOINT_DIR [REPEATS] [PROMPT]}
repeats=${2:-5}
prompt=${3:-C}
ptrain=${PTRAIN:-$(dirname "$0")/../build/ptrain}
seq_len=$(sed -n 's/.*"seq_len": *\([0-9]*\).*/\1/p' "$checkpoint/state.json" | head -1)
[[ -n $seq_len ]] || { echo "bench-sample: no seq_len in $checkpoint/state.json" >&2; exit 2; }
tokens=$((seq_len - 1))  # a one-token prompt (most prompts are): the context exactly full
run() {  # tokens/s of one run
  "$ptrain" sample --checkpoint "$checkpoint" --prompt "$prompt" --tokens "$tokens" --seed 1 --ignore-eot --timing "$@" \
    2>&1 >/dev/null | sed -n 's/.* s, \([0-9.]*\) tokens\/s.*/\1/p'
}
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
cached=() rerun=()
for ((i = 0; i < repeats; ++i)); do
  cached+=("$(run)")
  rerun+=("$(run --no-kv-cache)")
done
echo "checkpoint $checkpoint: $tokens tokens after a one-token prompt (context $seq_len), $(nproc) cores"
echo "KV cache            tokens/s: ${cached[*]}"
echo "whole window/token  tokens/s: ${rerun[*]}"
m_cached=$(printf '%s\n' "${cached[@]}" | median)
m_rerun=$(printf '%s\n' "${rerun[@]}" | median)
awk -v a="$m_cached" -v b="$m_rerun" 'BEGIN {printf "median: KV cache %.1f tokens/s, whole window %.1f tokens/s, %.2fx\n", a, b, a / b}'
