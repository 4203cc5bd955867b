#!/usr/bin/env bash
# GPU memory per precision mode and ZeRO stage on two ranks of the simulated device: for each,
# a 2-step run of build/tests/ptrain_simulated under mpirun (the real CUDA backend, its arena
# counting every block), the arena's measured peak per rank beside the plan that
# `ptrain train --dry-run --ranks 2` prints for the same config, and plan / peak. The arena's
# bytes are the CUDA backend's, so they are what a GPU run of this config would allocate; only
# the device's own context and cuDNN's choice of kernels stay on the GPU.
# A mode fp8:RECIPE+primary has precision.fp8.primary_weights, fp8:RECIPE+codes
# precision.fp8.mlp_input_codes, fp8:RECIPE+primary+codes both.
#   scripts/bench-memory-sim.sh [MODES="fp32 bf16 fp16 fp8:delayed fp8:current fp8:block fp8:current+primary fp8:current+codes"] [ZERO="0 1 2 3"]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
sim=${PTRAIN_SIMULATED:-$root/build/tests/ptrain_simulated}
[[ -x $sim ]] || { echo "bench-memory-sim: no $sim; build first (scripts/build.sh)" >&2; exit 2; }
modes=${1:-fp32 bf16 fp16 fp8:delayed fp8:current fp8:block fp8:current+primary fp8:current+codes}
zero_stages=${2:-0 1 2 3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mpi=(mpirun --oversubscribe --allow-run-as-root --bind-to none -np 2)
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl_vader_single_copy_mechanism=none PTRAIN_SIM_DEVICES=2

echo "2 ranks of the simulated device; GPT-2 blocks: 2 layers, n_embd 256, 4 heads, T 128, vocab 512, micro-batch 4, 2 micro-batches per rank"
printf '%-20s %4s %12s %14s %12s\n' mode zero "plan MiB" "arena peak MiB" "plan/peak"
for mode in $modes; do
  case $mode in
    fp8:*)  # fp8:RECIPE, then +primary and/or +codes in any order
      recipe=${mode#fp8:} settings=""
      recipe=${recipe%%+*}
      [[ $mode == *+primary* ]] && settings+=", primary_weights: true"
      [[ $mode == *+codes* ]] && settings+=", mlp_input_codes: true"
      precision="{mode: fp8, fp8: {recipe: $recipe$settings}}" ;;
    *) precision="{mode: $mode}" ;;
  esac
  # FP32 activations have no fused attention: the fallback, as a GPU run would take.
  [[ $mode == fp32 ]] && attention=fallback || attention=auto
  for zero in $zero_stages; do
    dir=$work/$mode-$zero
    mkdir -p "$dir"
    cat >"$dir/run.yaml" <<EOF
run: {name: r, out_dir: runs, seed: 3, device: cuda}
model: {n_layer: 2, n_head: 4, n_embd: 256, seq_len: 128, vocab_size: 512, attention: $attention}
data: {synthetic: {vocab: 512, order: 2, branching: 4, tokens: 200000, seed: 5}}
training: {steps: 2, batch_tokens: 2048, micro_batch: 4, eval_every: 0, eval_batches: 1}
precision: $precision
distributed: {zero_stage: $zero}
checkpoint: {save_final: false}
EOF
    (cd "$dir" && "${mpi[@]}" "$sim" train run.yaml >train.log 2>&1) ||
      { echo "bench-memory-sim: $mode zero $zero failed:" >&2; tail -20 "$dir/train.log" >&2; exit 1; }
    (cd "$dir" && "$sim" train run.yaml --dry-run --ranks 2 --set run.name=dry >dry.log 2>&1) ||
      { echo "bench-memory-sim: the dry run of $mode zero $zero failed:" >&2; tail -20 "$dir/dry.log" >&2; exit 1; }
    peak=$(grep -o '"device_memory_peak_mib":[0-9.e+-]*' "$dir/runs/r/metrics.jsonl" | cut -d: -f2 | sort -g | tail -1)
    plan=$(sed -n 's/.*GPU memory plan per rank: \([0-9.]*\) MiB.*/\1/p' "$dir/dry.log" | head -1)
    # cuDNN's workspace is sized on the device: the run's attention line gives it.
    workspace=$(sed -n 's/.*total workspace \([0-9]*\) B.*/\1/p' "$dir/train.log" | head -1)
    plan=$(awk -v p="$plan" -v w="${workspace:-0}" 'BEGIN {printf "%.1f", p + w / 1048576}')
    awk -v m="$mode" -v z="$zero" -v p="$plan" -v k="$peak" \
      'BEGIN {printf "%-20s %4s %12.1f %14.1f %12.3f\n", m, z, p, k, p / k}'
  done
done
