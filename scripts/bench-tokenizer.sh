#!/usr/bin/env bash
# GPT-2 tokenizer throughput, ptrain beside tiktoken's WebAssembly build and Hugging Face's
# tokenizers (the Rust library, through its node binding) on the same 10.8 MB of text (the 233
# State of the Union addresses): ptrain's `data prepare` on 1 thread and on all cores (its MB/s
# covers reading, tokenizing and writing the shards, not loading the vocabulary) of the
# addresses concatenated, tiktoken's encode_ordinary of that text in memory, and tokenizers'
# encodeBatch of the 233 addresses in memory, one sequence each, on 1 thread and on all cores
# (RAYON_NUM_THREADS). Each figure is the median of 5 runs. Results go to build/bench-tokenizer/.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
cache="${PTRAIN_CACHE:-$HOME/.cache/ptrain}"
out=build/bench-tokenizer
rm -rf "$out"
mkdir -p "$out"
cat "$cache"/text/sotu/*.txt >"$out/sotu.txt"
echo "corpus: $(wc -c <"$out/sotu.txt") bytes; CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"

median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
prepare_rate() {  # threads
  for run in 1 2 3 4 5; do
    rm -rf "$out/shards"
    ./build/ptrain data prepare --input "$out/sotu.txt" --out "$out/shards" --threads "$1" |
      sed -n 's/.*(\([0-9.]*\) MB\/s).*/\1/p'
  done | median
}
one=$(prepare_rate 1)
all=$(prepare_rate "$(nproc)")
peer=$(node tests/oracle/tiktoken.js bench "$out/sotu.txt")
hf_rate() { RAYON_NUM_THREADS=$1 node tests/oracle/hf_tokenizers.js bench "$cache"/text/sotu/*.txt; }
hf_one=$(hf_rate 1)
hf_all=$(hf_rate "$(nproc)")
printf '%-52s %8s\n' "tokenizer" "MB/s"
printf '%-52s %8s\n' "ptrain data prepare, 1 thread" "$one"
printf '%-52s %8s\n' "ptrain data prepare, $(nproc) threads" "$all"
printf '%-52s %8s\n' "tiktoken 1.0.22 (WebAssembly, node), 1 thread" "$peer"
printf '%-52s %8s\n' "HF tokenizers 0.23.2 (Rust, node binding), 1 thread" "$hf_one"
printf '%-52s %8s\n' "HF tokenizers 0.23.2 (Rust, node binding), $(nproc) threads" "$hf_all"
