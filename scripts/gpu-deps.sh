#!/usr/bin/env bash
# Run here, before a call on a device machine: downloads the Debian packages ptrain builds
# against into .gpu-deps/ (git-ignored, ~14 MB). The device machine has the CUDA toolkit but none
# of these and no network; name .gpu-deps in the call's `carry`, and scripts/gpu-check.sh
# unpacks them into a private prefix there.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(
  libopenblas0-openmp libopenblas-openmp-dev libopenblas-dev
  libyaml-cpp0.7 libyaml-cpp-dev libspdlog1.10 libspdlog-dev libfmt9 libfmt-dev
  libcli11-dev nlohmann-json3-dev catch2
)
mkdir -p .gpu-deps
cd .gpu-deps
rm -f ./*.deb
apt-get download "${packages[@]}" 2>&1 | grep -v -E "^W: Download is performed unsandboxed" || true
ls ./*.deb >/dev/null
du -sh .
