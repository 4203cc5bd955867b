#!/usr/bin/env bash
# Trains a tiny model of each architecture (on DEVICE: cpu or cuda, default cpu), exports it with
# `ptrain export --format hf`, loads that with transformers (scripts/hf_logits.py) and compares
# its logits with ptrain's own (`ptrain eval --dump-logits`), in fp32, within 1e-4.
# Exit 77 (skipped), saying why, where Python cannot import torch and transformers (Debian has
# no package of transformers: CI skips this; the GPU machine's image has it).
#   scripts/hf-check.sh [DEVICE]      PTRAIN_BINARY overrides build/ptrain
# Called by scripts/gpu-check.sh, whose LD_LIBRARY_PATH puts the bundle's copies of Debian's
# libraries (libgomp, OpenBLAS, ICU, ...) first: python3 runs with the path from before that
# (PTRAIN_ORIGINAL_LD_LIBRARY_PATH), so that PyTorch loads the libraries it was built with, and
# ptrain with the bundle's.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
ptrain="${PTRAIN_BINARY:-$repo/build/ptrain}"
device="${1:-cpu}"
. "$repo/scripts/gpu-check-lib.sh"  # py
if ! why="$(py -c 'import torch, transformers' 2>&1)"; then
  echo "hf-check: skipped: python3 cannot import torch and transformers ($(tail -1 <<<"$why"))"
  exit 77
fi
work="$(mktemp -d /tmp/ptrain-hf-check.XXXXXX)"
trap 'rm -rf "$work"' EXIT
cd "$work"
declare -A models=(
  [gpt2]="{n_layer: 2, n_head: 4, n_embd: 64, seq_len: 32, vocab_size: 300}"
  [llama]="{arch: llama, n_layer: 2, n_head: 4, n_kv_head: 2, n_embd: 64, seq_len: 32, vocab_size: 300, rope_theta: 500000}"
)
for arch in gpt2 llama; do
  cat >"$arch.yaml" <<YAML
run: {name: $arch, out_dir: runs, device: $device}
model: ${models[$arch]}
data: {synthetic: {vocab: 300, order: 1, branching: 3, tokens: 100000, seed: 3}}
training: {steps: 20, batch_tokens: 512, micro_batch: 16, eval_every: 0, eval_batches: 2}
optimizer: {lr: 1.0e-2}
YAML
  "$ptrain" train "$arch.yaml" >"$arch-train.log"
  checkpoint="runs/$arch/checkpoints/step_00000020"
  "$ptrain" export --checkpoint "$checkpoint" --format hf --out "$arch-hf"
  "$ptrain" eval "$arch.yaml" --checkpoint "$checkpoint" --dump-logits "$arch-logits.json"
  py "$repo/scripts/hf_logits.py" "$arch-hf" "$arch-logits.json" 1e-4
done
