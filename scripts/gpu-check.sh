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

# cuDNN: the toolkit's, or else the nvidia-cudnn Python wheel's (what the device image has).
if [ ! -e /usr/local/cuda/include/cudnn.h ]; then
  cudnn_root="$(python3 -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null || true)"
  if [ -n "$cudnn_root" ] && [ -e "$cudnn_root/include/cudnn.h" ]; then
    prefix_args+=(-DCUDNN_ROOT="$cudnn_root")
    export LD_LIBRARY_PATH="$cudnn_root/lib:${LD_LIBRARY_PATH:-}"
    echo "cuDNN: $cudnn_root"
  else
    echo "cuDNN: not in /usr/local/cuda and no nvidia-cudnn wheel found; the build will say what is missing"
  fi
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
# With a GPU present, a test that reports "Skipped" (ptrain found no usable device) is a failure.
gpu_log=/tmp/ptrain-gpu-tests.log
run "gpu tests" ctest --test-dir build-gpu -L '^gpu$' --no-tests=error --output-on-failure --timeout 120 \
  >"$gpu_log" 2>&1
cat "$gpu_log"
grep -q "(Skipped)" "$gpu_log" && failed+=("gpu tests: skipped on a machine with a GPU (ptrain found no usable device)")

section "2 ranks on 2 GPUs (NCCL)"
gpus=$(nvidia-smi -L | wc -l)
if [ "$gpus" -lt 2 ]; then
  not_run+=("the 2-rank NCCL case: this machine has $gpus GPU(s)")
elif [ ! -x build-gpu/tests/ptrain_multigpu_tests ]; then
  not_run+=("the 2-rank NCCL case: this build has no MPI (install libopenmpi-dev) or no NCCL")
else
  run "multigpu tests" ctest --test-dir build-gpu -L multigpu --output-on-failure --timeout 300
fi

section "compute-sanitizer (memcheck, racecheck) on the gpu tests"
if command -v compute-sanitizer >/dev/null; then
  # The kernel tests, and one whole forward/backward through the backend (every op once).
  run "memcheck" compute-sanitizer --tool memcheck --error-exitcode 1 build-gpu/tests/ptrain_gpu_tests \
    "*on the device*" "gpu: one micro-batch*"
  run "racecheck" compute-sanitizer --tool racecheck --error-exitcode 1 build-gpu/tests/ptrain_gpu_tests "*on the device*"
else
  not_run+=("compute-sanitizer: not on the PATH")
fi

section "benchmark (medians over steps 2-8; MFU against the data sheet's dense peak)"
table=()
budget=450  # seconds since the start after which no further benchmark starts (one call: 8 minutes)
bench() {  # bench MODEL MODE [--set ...]: one row of the table
  local model="$1" mode="$2"
  shift 2
  if [ $(($(date +%s) - start)) -gt $budget ]; then
    not_run+=("bench $model $mode $*: the 8-minute budget was spent")
    return
  fi
  local out
  out="$(timeout 60 build-gpu/ptrain bench "configs/bench-gpu/gpt2-$model.yaml" --set precision.mode="$mode" "$@" 2>&1)"
  local status=$?
  if [ $status -ne 0 ]; then
    echo "$out" | tail -5
    [ $status -eq 124 ] && failed+=("bench $model $mode $*: over 60 s (hung?)") || failed+=("bench $model $mode $* (exit $status)")
    return
  fi
  local field
  field() { echo "$out" | awk -v key="$1" 'index($0, key) { print $(NF - ($2)) }' | tail -1; }
  # Which attention ran (cudnn or fallback) and how many FP8 linears ran native FP8 GEMMs.
  local attention fp8_native
  attention="$(echo "$out" | grep -m1 -o 'attention: [a-z]*' | cut -d' ' -f2)"
  fp8_native="$(echo "$out" | grep -m1 -o 'fp8: [0-9]* of [0-9]*' | cut -d' ' -f2,4 | tr ' ' /)"
  table+=("$(printf '%-6s %-22s %10s %9s %8s %9s %-9s %s' "$model" "$mode $*" "$(field 'tokens/s' 0)" \
    "$(field 'model FLOP/s' 6)" "$(field 'MFU' 1)" "$(field 'peak device memory' 1)" "${attention:-?}" "${fp8_native:--}")")
}
bench 124m fp32
bench 124m bf16
bench 124m bf16 --set model.fused_gelu=false  # what the GELU epilogues buy
bench 124m bf16 --set training.cuda_graph=true  # what replaying CUDA graphs buys
for recipe in delayed current block; do bench 124m fp8 --set precision.fp8.recipe=$recipe; done
for model in 350m 774m; do
  bench "$model" bf16
  bench "$model" fp8 --set precision.fp8.recipe=delayed
done
printf '%-6s %-22s %10s %9s %8s %9s %-9s %s\n' model precision "tokens/s" "TFLOP/s" "MFU %" "peak GiB" attention \
  "native fp8"
for row in "${table[@]}"; do echo "$row"; done

section "summary"
for item in "${not_run[@]}"; do echo "not run: $item"; done
for item in "${failed[@]}"; do echo "FAILED: $item"; done
echo "elapsed $(($(date +%s) - start)) s"
[ ${#failed[@]} -eq 0 ]
