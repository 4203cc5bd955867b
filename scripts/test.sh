#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test through ctest; then builds the kernel
# tests once more with AddressSanitizer and runs them (kernels run on the CPU under the SIMT
# emulator, so an out-of-bounds access in a kernel shows up there), and last runs every fuzzer
# for 30 s (scripts/fuzz.sh). Arguments go to the first ctest (e.g. -R layernorm) and skip the
# AddressSanitizer and fuzzing steps. Tests run one at a time: each is multi-threaded, and two at
# once on two cores would oversubscribe them; except those on the simulated device (label sim),
# which run one core each (the SIMT emulator runs one block at a time) and so run nproc at once.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
# build.sh's install step (scripts/install-deps.sh) installs Chromium: the report test must find it.
export PTRAIN_REQUIRE_CHROMIUM=1
if [ $# -gt 0 ]; then
  (cd build && ctest --output-on-failure --no-tests=error "$@")
  exit 0
fi
(cd build && ctest --output-on-failure --no-tests=error -LE '^sim$')
(cd build && ctest --output-on-failure --no-tests=error -L '^sim$' -j "$(nproc)")

echo "== kernel tests under AddressSanitizer (build-asan/)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release -DPTRAIN_ASAN=ON -DPTRAIN_CUDA=OFF >/dev/null
cmake --build build-asan -j "$(nproc)" --target ptrain_kernel_tests
(cd build-asan && ctest --output-on-failure --no-tests=error -R '^kernels/')

echo "== fuzzers: every parser of outside input, 30 s each, two at a time (build-fuzz/)"
./scripts/fuzz.sh 30
