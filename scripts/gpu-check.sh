#!/usr/bin/env bash
# Everything ptrain checks on a GPU, in one call of at most 8 minutes on an H100/H200: the
# device, a build for sm_90a, the `gpu` tests (each kernel on the device against the CPU
# backend), compute-sanitizer's memcheck and racecheck on them, and the benchmark table. Prints
# what it could not run and why, and exits non-zero if anything that ran failed.
#
# Dependencies: if .gpu-deps/ holds Debian packages (scripts/gpu-deps.sh, carried to the device
# machine), they are unpacked into a private prefix and built against.
set -uo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
failed=()
not_run=()
section() { printf '\n== %s (%ss)\n' "$*" "$(($(date +%s) - start))"; }
run() {  # run NAME COMMAND...: records a failure without stopping the script
  local name="$1"
  shift
  "$@" || failed+=("$name (exit $?)")
}

section "device"
if ! nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader; then
  echo "no NVIDIA GPU visible (nvidia-smi failed): nothing here can run"
  exit 1
fi
nvcc --version | tail -2

prefix_args=()
if compgen -G ".gpu-deps/*.deb" >/dev/null; then
  prefix=/tmp/ptrain-deps
  for deb in .gpu-deps/*.deb; do dpkg -x "$deb" "$prefix"; done
  prefix_args=(-DPTRAIN_DEPS_PREFIX="$prefix/usr")
  export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu:$prefix/usr/lib/x86_64-linux-gnu/openblas-openmp:${LD_LIBRARY_PATH:-}"
  echo "dependencies: unpacked $(ls .gpu-deps/*.deb | wc -l) packages into $prefix"
fi

section "build for sm_90a"
if ! cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DPTRAIN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90a -DPTRAIN_KERNEL_TESTS=OFF \
       "${prefix_args[@]}" >/tmp/ptrain-build-gpu.log 2>&1 || ! cmake --build build-gpu -j "$(nproc)" >>/tmp/ptrain-build-gpu.log 2>&1; then
  tail -40 /tmp/ptrain-build-gpu.log
  echo "build failed: nothing else can run"
  exit 1
fi
echo "built"

section "gpu tests"
run "gpu tests" ctest --test-dir build-gpu -L gpu --output-on-failure --timeout 120

section "compute-sanitizer (memcheck, racecheck) on the gpu tests"
if command -v compute-sanitizer >/dev/null; then
  run "memcheck" compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/tests/ptrain_gpu_tests
  run "racecheck" compute-sanitizer --tool racecheck --error-exitcode 1 build-gpu/tests/ptrain_gpu_tests
else
  not_run+=("compute-sanitizer: not on the PATH")
fi

section "benchmark"
not_run+=("benchmark table (GPT-2 124M/350M/774M, fp32/bf16/fp8): ptrain has no CUDA backend yet, so no GPU training step exists to time")

section "summary"
for item in "${not_run[@]}"; do echo "not run: $item"; done
for item in "${failed[@]}"; do echo "FAILED: $item"; done
echo "elapsed $(($(date +%s) - start)) s"
[ ${#failed[@]} -eq 0 ]
