#!/usr/bin/env bash
# Tokenizer throughput for each vocabulary (GPT-2's, cl100k_base, o200k_base, Llama 3's 128k),
# ptrain beside tiktoken's WebAssembly build and Hugging Face's tokenizers (the Rust library,
# through its node binding) on the same 10.8 MB of text (the 233 State of the Union addresses):
# ptrain's `data prepare` on 1 thread and on all cores (its MB/s covers reading, tokenizing and
# writing the shards, not loading the vocabulary) of the addresses concatenated, tiktoken's
# encode_ordinary of that text in memory (its encodings: gpt2, cl100k_base, o200k_base), and
# tokenizers' encodeBatch of the 233 addresses in memory, one sequence each, on 1 thread and on
# all cores (RAYON_NUM_THREADS), for GPT-2 (built from OpenAI's files), cl100k_base and
# o200k_base (the tokenizer.json `ptrain data hf-tokenizer` writes, which the oracle tests show
# encodes as tiktoken does) and Llama 3 (its tokenizer.json). Each figure is the median of 5
# runs; "-" where the peer has no such tokenizer. Results go to build/bench-tokenizer/.
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
prepare_rate() {  # tokenizer threads
  for run in 1 2 3 4 5; do
    rm -rf "$out/shards"
    ./build/ptrain data prepare --input "$out/sotu.txt" --out "$out/shards" --tokenizer "$1" --threads "$2" |
      sed -n 's/.*(\([0-9.]*\) MB\/s).*/\1/p'
  done | median
}
hf_rate() {  # tokenizer.json ("" for GPT-2's) threads
  HF_TOKENIZER_JSON=$1 RAYON_NUM_THREADS=$2 node tests/oracle/hf_tokenizers.js bench "$cache"/text/sotu/*.txt
}
n=$(nproc)
printf '%-12s %12s %12s %12s %12s %12s\n' "MB/s" "ptrain 1t" "ptrain ${n}t" "tiktoken 1t" "HF 1t" "HF ${n}t"
for tokenizer in gpt2 cl100k_base o200k_base llama3; do
  one=$(prepare_rate "$tokenizer" 1)
  all=$(prepare_rate "$tokenizer" "$n")
  peer=-
  [ "$tokenizer" = llama3 ] || peer=$(TIKTOKEN_ENCODING=$tokenizer node tests/oracle/tiktoken.js bench "$out/sotu.txt")
  case $tokenizer in
    gpt2) file="" ;;
    llama3) file="$cache/llama3/tokenizer.json" ;;
    *)
      ./build/ptrain data hf-tokenizer --tokenizer "$tokenizer" --out "$out/hf-$tokenizer" >/dev/null
      file="$out/hf-$tokenizer/tokenizer.json"
      ;;
  esac
  hf_one=$(hf_rate "$file" 1)
  hf_all=$(hf_rate "$file" "$n")
  printf '%-12s %12s %12s %12s %12s %12s\n' "$tokenizer" "$one" "$all" "$peer" "$hf_one" "$hf_all"
done
echo "(tiktoken 1.0.22, WebAssembly under node; HF tokenizers 0.23.2, Rust through its node binding)"
