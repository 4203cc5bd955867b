#!/usr/bin/env bash
# Installs the Debian packages ptrain builds and tests with, if any is missing.
# Runs apt-get only when something is missing, so repeated calls are instant.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libcli11-dev libyaml-cpp-dev libspdlog-dev nlohmann-json3-dev catch2
  libopenblas-openmp-dev libboost-context-dev
  openmpi-bin libopenmpi-dev
  clang libclang-rt-14-dev
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
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing: ${missing[*]}"
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
$sudo_cmd apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q --no-install-recommends "${missing[@]}"
