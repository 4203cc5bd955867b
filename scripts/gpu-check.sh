#!/usr/bin/env bash
# What ptrain checks on a borrowed H100/H200. Nothing is built there: scripts/gpu-bundle.sh
# builds here and the device call carries .gpu-bundle/. A lease has 15 minutes of device time,
# the machine's start included, and a call may run 10: each stage is one call that ends within
# its budget (GPU_CHECK_BUDGET seconds, default 540; give the call 600).
#
#   scripts/gpu-check.sh [first]         the first lease: the device and the CUDA libraries
#                                        loaded, one short training run per precision mode on
#                                        cuda and on cpu, loss by loss, the gpu tests, the
#                                        Hugging Face export against transformers, ZeRO-0 to 3
#                                        across GPUs where the machine has two (else a SKIP
#                                        line saying why), then the benchmark rows the budget
#                                        has time left for
#   scripts/gpu-check.sh speed [REGEX]   the benchmark table; REGEX keeps the rows whose label
#                                        ("124m bf16", "124m fp8 recipe=block", ...) matches
#   scripts/gpu-check.sh sanitize        compute-sanitizer: memcheck (with the arena's blocks
#                                        registered through NVTX) on short training runs,
#                                        racecheck on every backend op test, and which of the
#                                        kernels each reached
#   scripts/gpu-check.sh --plan [STAGE]  each step with its expected seconds and its limit, and
#                                        the total against the budget (exit 1 when over); needs
#                                        no GPU
#
# Results go to $OUT (the device tool's output folder; ./gpu-check-out elsewhere), each written
# as a step ends, so that a call killed at its limit still brings back what it learned:
#   STAGE.log                    everything printed
#   STAGE-summary.txt            the GPU, the CUDA libraries ldd resolved and the versions they
#                                report (ptrain devices), then a line per step: PASS, FAIL, TIME
#                                (its limit ran out) or SKIP, its seconds, its name
#   STAGE-failures.log           each failing step's last lines and cuDNN's errors and warnings
#   STAGE-library-choices.jsonl  what cuBLASLt and cuDNN accepted, refused and chose for every
#                                GEMM and attention graph (PTRAIN_LIBRARY_LOG)
#   STAGE-bench.txt              the benchmark table, a row at a time
#   STAGE-details.tar.gz         at the end, or when stopped by a signal: each step's log and
#                                metrics, the kernels launched (PTRAIN_KERNEL_LOG)
# Exit status: 0 when every step that ran passed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
repo="$(pwd)"
. scripts/gpu-check-lib.sh

usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

plan=false
if [ "${1:-}" = "--plan" ]; then
  plan=true
  shift
fi
stage="${1:-}"
[ $# -gt 0 ] && shift
case "$stage" in
  "") $plan || stage=first ;;
  first | sanitize) [ $# -eq 0 ] || usage ;;
  speed) [ $# -le 1 ] || usage ;;
  *) usage ;;
esac
speed_filter="${1:-.}"
budget="${GPU_CHECK_BUDGET:-540}"
modes=(fp32 bf16 fp16 fp8:delayed fp8:current fp8:block fp8:current+primary)  # +primary: primary FP8 weights

# ---------------------------------------------------------------------------- seconds
# Expected seconds: estimates, NOT measurements; no lease has run these steps yet. They assume
# that a process starting CUDA (its context, cuBLASLt, cuDNN) spends about 5 s before its work,
# that a 10-step run of the small model below adds about 5 s on the GPU (cuDNN compiling its
# attention graphs) and takes 4 s on the CPU, an op test 2 s, a training test (it runs ptrain
# 6 to 16 times) 60 s, a benchmark row (model init and 8 steps) 30 s at 124M and more above, and
# compute-sanitizer slowing kernels and the libraries' start some tenfold. The summary's seconds
# are the measurements: put them here after a lease. A step starts only when its expected
# seconds fit in what the budget has left, and its limit is cut to that.
t_setup=10        # unpacking the bundle (xz) and finding the CUDA libraries
t_device=5        # nvidia-smi, ldd, ptrain devices
t_train_cuda=10
t_train_cpu=4
t_op_tests=10     # one process's CUDA start, then
t_op_test=2       # each op or kernel test in it
t_train_test=60
t_alone=20        # a gpu test in a process of its own
t_hf=60
t_multigpu=450    # tests/multigpu: 17 runs of ptrain, 16 of them under mpirun on 2 GPUs (scaled from 10 runs in 300 s; never timed: no lease has had 2 GPUs)
t_memcheck=45
t_racecheck=240
t_finish=5        # the details tarball
reserve=15        # kept from every step's share: the finish, and `timeout`'s 5 s of grace
bench_expected() { case "$1" in *-124m | *-125m) echo 30 ;; *-350m) echo 45 ;; *) echo 60 ;; esac; }

limit_device=60
limit_train=90
limit_op_tests=300
limit_train_tests=420
limit_alone=150
limit_hf=150
limit_multigpu=590
limit_bench=90
limit_memcheck=150
limit_racecheck=300

# ---------------------------------------------------------------------------- the benchmark rows
# label|config|--set overrides. Ordered by what a first look at speed needs most.
bench_rows=(
  "124m bf16|gpt2-124m|precision.mode=bf16"
  "124m fp8 recipe=current|gpt2-124m|precision.mode=fp8 precision.fp8.recipe=current"
  "124m fp8 recipe=block|gpt2-124m|precision.mode=fp8 precision.fp8.recipe=block"
  "124m fp8 recipe=delayed|gpt2-124m|precision.mode=fp8 precision.fp8.recipe=delayed"
  "124m fp32 tf32|gpt2-124m|precision.mode=fp32 precision.tf32=true"
  "124m bf16 attention=fallback|gpt2-124m|precision.mode=bf16 model.attention=fallback"
  "124m bf16 fused_gelu=false|gpt2-124m|precision.mode=bf16 model.fused_gelu=false"
  "124m bf16 cuda_graph|gpt2-124m|precision.mode=bf16 training.cuda_graph=true"
  "124m fp8 recipe=current primary_weights|gpt2-124m|precision.mode=fp8 precision.fp8.recipe=current precision.fp8.primary_weights=true"
  "350m bf16|gpt2-350m|precision.mode=bf16"
  "350m fp8 recipe=current|gpt2-350m|precision.mode=fp8 precision.fp8.recipe=current"
  "774m bf16|gpt2-774m|precision.mode=bf16"
  "774m fp8 recipe=current|gpt2-774m|precision.mode=fp8 precision.fp8.recipe=current"
  "llama 125m bf16|llama-125m|precision.mode=bf16"
  "llama 125m fp8 recipe=current|llama-125m|precision.mode=fp8 precision.fp8.recipe=current"
  "llama 350m bf16|llama-350m|precision.mode=bf16"
  "llama 1b bf16|llama-1b|precision.mode=bf16"
  "llama 1b fp8 recipe=current|llama-1b|precision.mode=fp8 precision.fp8.recipe=current"
  "llama 1b fp8 mlp_input_codes|llama-1b|precision.mode=fp8 precision.fp8.recipe=current precision.fp8.mlp_input_codes=true"
)
# The rows a stage benchmarks: all in `first` (as many as fit), those matching REGEX in `speed`.
stage_rows() {
  local row
  for row in "${bench_rows[@]}"; do
    [ "$1" = speed ] && ! [[ "${row%%|*}" =~ $speed_filter ]] && continue
    echo "$row"
  done
}

# The gpu tests in two groups, each one process: the op and kernel tests, then the training
# tests (which start ptrain). Counted from the bundle's list when there is one, else from the
# sources (--plan without a bundle).
ops_filter="[gpu]~[train]"
train_filter="[train]"
n_ops=$(grep -h 'TEST_CASE("gpu: ' tests/gpu/*.cpp | grep -vc '\[train\]')
n_train=$(grep -h 'TEST_CASE("gpu: ' tests/gpu/*.cpp | grep -c '\[train\]')
counted="counted in tests/gpu/*.cpp"

# ---------------------------------------------------------------------------- --plan
# plan_steps STAGE: EXPECTED|LIMIT|STEP for each step of STAGE in the order it runs them (the
# step names the summary uses), benchmark rows while they fit; then "left|-|ROWS" for the rest.
plan_steps() {
  local s="$1" fixed total mode row config expected left=""
  fixed="$(
    echo "$t_setup|-|unpack the bundle, find the CUDA libraries"
    echo "$t_device|$limit_device|the GPU, the CUDA libraries, ptrain devices"
    case "$s" in
      first)
        for mode in "${modes[@]}"; do
          echo "$t_train_cuda|$limit_train|train $mode on cuda"
          echo "$t_train_cpu|$limit_train|train $mode on cpu"
        done
        echo "$((t_op_tests + t_op_test * n_ops))|$limit_op_tests|gpu tests: $n_ops op and kernel tests in one process"
        echo "$((t_train_test * n_train))|$limit_train_tests|gpu tests: $n_train training tests in one process"
        echo "$t_hf|$limit_hf|hf export vs transformers"
        ;;
      sanitize)
        for mode in bf16 fp8:current fp8:block; do echo "$t_memcheck|$limit_memcheck|memcheck: train $mode"; done
        echo "$t_racecheck|$limit_racecheck|racecheck: the op and kernel tests"
        ;;
    esac
  )"
  echo "$fixed"
  total=$(awk -F'|' '{ s += $1 } END { print s }' <<<"$fixed")
  if [ "$s" != sanitize ]; then
    while IFS= read -r row; do
      config="$(cut -d'|' -f2 <<<"$row")"
      expected=$(bench_expected "$config")
      if [ -z "$left" ] && [ $((total + expected)) -le $((budget - reserve)) ]; then
        echo "$expected|$limit_bench|bench ${row%%|*}"
        total=$((total + expected))
      else
        left="$left${left:+; }${row%%|*}"
      fi
    done < <(stage_rows "$s")
  fi
  echo "$t_finish|-|the details tarball"
  [ -z "$left" ] || echo "left|-|$left"
}

# print_plan STAGE: the table of plan_steps, what the steps do, and the total against the budget;
# status 1 when the total is over it.
print_plan() {
  local s="$1" expected limit name total=0
  case "$s" in
    first) echo "first (the default; budget ${budget} s): the device, one training run per mode against the CPU, the gpu tests, then speed" ;;
    speed) echo "speed (budget ${budget} s): ptrain bench, the rows matching '${speed_filter}' that fit" ;;
    sanitize) echo "sanitize (budget ${budget} s): compute-sanitizer, which the SIMT emulator cannot replace" ;;
  esac
  printf '  %8s %6s  %s\n' expected limit step
  while IFS='|' read -r expected limit name; do
    if [ "$expected" = left ]; then
      echo "  not expected to fit, left for $([ "$s" = first ] && echo "the speed stage" || echo "another call"): $name" |
        fold -s -w 100 | sed '2,$s/^/    /'
      continue
    fi
    printf '  %7ss %6s  %s\n' "$expected" "$limit" "$name"
    total=$((total + expected))
  done < <(plan_steps "$s")
  case "$s" in
    first)
      echo "  train: 10 steps of a 2-layer, width-128 model (lr 3e-3 from the first step) per mode, on cuda and on"
      echo "    cpu; the log prints each step's loss on both and their relative difference"
      echo "  gpu tests (${counted}): each group in one process, one CUDA start for all of its tests;"
      echo "    Catch2's XML reporter writes each test's result as it ends, so after a crash or a timeout the"
      echo "    test that was running is known, and the tests after it run each alone; a failing test runs once"
      echo "    more alone with CUDA_LAUNCH_BLOCKING=1 (${t_alone} s expected, ${limit_alone} s at most, from the"
      echo "    benchmark rows' time); the summary has both outcomes; a test that skips on a GPU machine fails"
      echo "  every step logs cuDNN's errors and warnings (CUDNN_LOGLEVEL_DBG=2: why engines were refused);"
      echo "    a failing step's entry in first-failures.log counts them"
      echo "  hf export: scripts/hf-check.sh cuda, a tiny gpt2 and llama trained on cuda, exported with --format hf,"
      echo "    loaded by transformers, logits against ptrain's within 1e-4 (exit 77, a failure here, when"
      echo "    transformers is missing); its python3 runs with the library path from before the bundle's"
      echo "  ZeRO-0 to 3 across GPUs: tests/multigpu (2 GPUs under mpirun against 1) on a machine with 2 GPUs,"
      echo "    mpirun and a bundle built with MPI (${t_multigpu} s expected, ${limit_multigpu} s at most, from the"
      echo "    benchmark rows' time); otherwise a SKIP line saying which is missing, and no time"
      echo "  bench: ptrain bench, medians over steps 2-8, in the speed stage's order while they fit"
      ;;
    speed)
      echo "  each row: configs/bench-gpu/CONFIG.yaml --set ...; tokens/s, model TFLOP/s, MFU against the data"
      echo "    sheet's dense peak, peak memory beside the dry run's plan, the attention path and how many GEMMs ran native FP8"
      ;;
    sanitize)
      echo "  memcheck --nvtx yes (arena blocks registered as NVTX regions, so a write past a block is seen) on"
      echo "    3-step training runs: bf16 (fused attention), fp8 current, fp8 block"
      echo "  racecheck on every backend op and kernel test (ptrain_gpu_tests '${ops_filter}', one comma-free"
      echo "    filter, -w NoTests so a filter matching nothing fails)"
      echo "  then the kernels each tool reached (PTRAIN_KERNEL_LOG) against every __global__ in kernels/"
      ;;
  esac
  if [ "$total" -le "$budget" ]; then
    echo "  total expected: ${total} s of the ${budget} s budget: fits"
  else
    echo "  total expected: ${total} s, over the ${budget} s budget by $((total - budget)) s"
    return 1
  fi
}

if $plan; then
  echo "gpu-check plan: each stage is one device call (give it 600 s); carry .gpu-bundle (scripts/gpu-bundle.sh)"
  echo "Expected seconds are estimates, not measurements: no lease has run these steps yet (see the script)."
  fits=0
  for s in first speed sanitize; do
    [ -z "$stage" ] || [ "$stage" = "$s" ] || continue
    echo
    print_plan "$s" || fits=1
  done
  exit $fits
fi

# ---------------------------------------------------------------------------- results
out="${OUT:-$repo/gpu-check-out}"
mkdir -p "$out"
work="$(mktemp -d /tmp/ptrain-gpu-check.XXXXXX)"
mkdir -p "$work/logs" "$work/runs"
summary="$out/$stage-summary.txt"
failures="$out/$stage-failures.log"
rm -f "$out/$stage.log" "$failures" "$out/$stage-library-choices.jsonl" "$out/$stage-bench.txt" "$out/$stage-details.tar.gz"
echo "gpu-check $stage on $(hostname) at $(date -u +%Y-%m-%dT%H:%M:%SZ), budget ${budget} s" >"$summary"
exec > >(tee -a "$out/$stage.log") 2>&1
tee_pid=$!
failed=0

export PTRAIN_LIBRARY_LOG="$work/library-choices.jsonl"
export PTRAIN_KERNEL_LOG="$work/kernels-launched.txt"
# The library path from before the bundle's libraries went first, for python3 (hf-check.sh says why).
export PTRAIN_ORIGINAL_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"

record() {  # record RESULT SECONDS TEXT: one summary line, written at once
  printf '%-5s %5ss  %s\n' "$1" "$2" "$3" | tee -a "$summary"
  case "$1" in FAIL | TIME) failed=1 ;; esac
}

fail_log() {  # fail_log TITLE < TEXT: an entry of STAGE-failures.log
  { echo "== $1"; cat; echo; } >>"$failures"
}

save_library_log() {
  [ -f "$PTRAIN_LIBRARY_LOG" ] && cp "$PTRAIN_LIBRARY_LOG" "$out/$stage-library-choices.jsonl"
}

finish() {
  trap - EXIT TERM INT
  save_library_log
  tar -C "$work" --exclude=./bundle -czf "$out/$stage-details.tar.gz" . 2>/dev/null
  rm -rf "$work"
  echo
  echo "== $stage: summary (${SECONDS} s of ${budget})"
  cat "$summary"
  echo "details: $out/$stage-details.tar.gz"
  exec >&- 2>&-  # the log's last lines are in STAGE.log before the call returns
  wait "$tee_pid" 2>/dev/null
}
trap 'finish; exit $failed' EXIT
trap 'record FAIL 0 "stopped by a signal"; exit 1' TERM INT

slug() { tr -c 'A-Za-z0-9._-' '_' <<<"$1" | cut -c1-80; }

fits() {  # fits EXPECTED: whether the budget has EXPECTED seconds left
  [ $((budget - SECONDS - reserve)) -ge "$1" ]
}

cudnn_reasons() {  # cudnn_reasons LOG: the distinct errors and warnings of a cuDNN log, most frequent first
  [ -s "$1" ] || return 0
  echo "-- cuDNN's errors and warnings ($(basename "$1") in the details), by count:"
  grep -hoE '(Error|Warning): .*' "$1" | sort | uniq -c | sort -rn | head -20
}

# step NAME EXPECTED LIMIT COMMAND...: runs COMMAND under min(LIMIT, what the budget has left),
# when its EXPECTED seconds fit, its output in logs/NN-NAME.log (step_log names it) and cuDNN's
# errors and warnings in logs/NN-NAME.cudnn.log (kept when it fails, at most its last 2 MiB).
# Exit 77 (a test that found no GPU) counts as a failure here.
steps=0
step_log=""
timed=false  # the steps run now are timed (benchmark rows): no cuDNN logging
step() {
  local name="$1" expected="$2" limit="$3"
  shift 3
  local left=$((budget - SECONDS - reserve))
  if ! fits "$expected"; then
    record SKIP 0 "$name: expected to take ${expected} s, ${left} s of the budget left"
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local file log cudnn t0=$SECONDS rc took text
  steps=$((steps + 1))
  file="$(printf '%02d' "$steps")-$(slug "$name")"
  log="$work/logs/$file.log"
  step_log="$log"
  cudnn="$work/logs/$file.cudnn.log"
  local logging=(CUDNN_LOGLEVEL_DBG=2 "CUDNN_LOGDEST_DBG=$cudnn")
  $timed && logging=()  # logging would slow what a benchmark row times
  env "${logging[@]}" timeout -k 5 "$limit" "$@" </dev/null >"$log" 2>&1
  rc=$?
  took=$((SECONDS - t0))
  case $rc in
    0) record PASS "$took" "$name" ;;
    124 | 137) text="$name: over its ${limit}-second limit"; record TIME "$took" "$text" ;;
    77) text="$name: skipped on a machine with a GPU"; record FAIL "$took" "$text" ;;
    *) text="$name (exit $rc)"; record FAIL "$took" "$text" ;;
  esac
  if [ $rc -eq 0 ]; then
    rm -f "$cudnn"
  else
    tail -25 "$log"
    if [ -f "$cudnn" ]; then
      tail -c 2M "$cudnn" >"$cudnn.end" && mv "$cudnn.end" "$cudnn"
    fi
    { echo "-- the last 40 lines of logs/$file.log (in the details):"; tail -40 "$log"; cudnn_reasons "$cudnn"; } |
      fail_log "$text, after ${took} s"
  fi
  save_library_log
  return $rc
}

# ---------------------------------------------------------------------------- the bundle
bundle="${PTRAIN_GPU_BUNDLE:-$repo/.gpu-bundle/ptrain-gpu.tar.xz}"
if [ ! -f "$bundle" ]; then
  record FAIL 0 "no bundle at $bundle: run scripts/gpu-bundle.sh here and carry .gpu-bundle"
  exit 1
fi
mkdir -p "$work/bundle"
tar -C "$work/bundle" -xJf "$bundle"
bin="$work/bundle/bin"
export PTRAIN_BINARY="$bin/ptrain" PTRAIN_SOURCE_DIR="$repo"

# The CUDA libraries: the toolkit's, else the nvidia-* Python wheels' (what the device image has).
lib_dirs="$work/bundle/lib"
for soname in libcudart.so.13 libcublasLt.so.13 libcublas.so.13 libcudnn.so.9 libnccl.so.2; do
  found=""
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
    [ -e "$dir/$soname" ] && found="$dir" && break
  done
  if [ -z "$found" ]; then
    for site in $(python3 -c 'import site, sys; print(" ".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))' 2>/dev/null); do
      [ -d "$site/nvidia" ] || continue
      hit="$(find "$site/nvidia" -name "$soname" 2>/dev/null | head -1)"
      [ -n "$hit" ] && found="$(dirname "$hit")" && break
    done
  fi
  [ -n "$found" ] && lib_dirs="$lib_dirs:$found"
done
export LD_LIBRARY_PATH="$lib_dirs:${LD_LIBRARY_PATH:-}"
unresolved="$(ldd "$bin/ptrain" "$bin/ptrain_gpu_tests" | grep 'not found' | sort -u)"
if [ -n "$unresolved" ]; then
  record FAIL 0 "libraries not found on this machine: $(echo "$unresolved" | awk '{ print $1 }' | tr '\n' ' ')"
  exit 1
fi
"$bin/ptrain_gpu_tests" --list-test-names-only "$ops_filter" | grep . >"$work/ops-tests.txt"
"$bin/ptrain_gpu_tests" --list-test-names-only "$train_filter" | grep . >"$work/train-tests.txt"
n_ops=$(wc -l <"$work/ops-tests.txt")
n_train=$(wc -l <"$work/train-tests.txt")
counted="listed by the bundle's ptrain_gpu_tests"

# ---------------------------------------------------------------------------- the device
# The summary's head, before any step's line: the GPU, the bundle, the file each CUDA library's
# name resolved to (ldd) and the versions the loaded libraries report (ptrain devices).
device_facts() {
  local lib soname path
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1 | head -1)"
  sed -n '2,3p' "$work/bundle/MANIFEST"
  echo "CUDA libraries of bin/ptrain (ldd, and the file each resolves to):"
  for lib in libcudart libcublasLt libcublas libcudnn libnccl; do
    read -r soname path < <(ldd "$bin/ptrain" | awk -v lib="$lib.so" 'index($1, lib) == 1 && $2 == "=>" { print $1, $3 }')
    if [ -n "${soname:-}" ]; then
      echo "  $soname => $path ($(basename "$(readlink -f "$path")"))"
    elif [ "$lib" = libcublasLt ]; then  # dlopen'ed by the CUDA backend (cublaslt_on_demand.cpp)
      echo "  $lib: loaded on first use, not linked (its version: ptrain devices, below)"
    else
      echo "  $lib: not linked"
    fi
  done
  echo "ptrain devices:"
  sed 's/^/  /' "$work/devices.txt"
}

echo "== $stage on $(hostname) at $(date -u +%H:%M:%SZ), budget ${budget} s"
print_plan "$stage"
echo
cp "$work/bundle/MANIFEST" "$work/"
t0=$SECONDS
timeout -k 5 "$limit_device" "$bin/ptrain" devices >"$work/devices.txt" 2>&1
devices_rc=$?
device_facts | tee -a "$summary"
if [ $devices_rc -ne 0 ]; then
  record FAIL $((SECONDS - t0)) "ptrain devices (exit $devices_rc): the bundle does not run here"
  exit 1
fi
if grep -q "no usable CUDA device" "$work/devices.txt"; then
  record FAIL $((SECONDS - t0)) "no usable CUDA device: nothing else can run"
  exit 1
fi
# cuBLASLt is loaded on first use, not linked (cublaslt_on_demand.cpp): the ldd check above does
# not see it missing, and ptrain devices names it "none" instead of failing. Every GPU step
# needs it.
if grep -q "cuBLASLt none" "$work/devices.txt"; then
  record FAIL $((SECONDS - t0)) "cuBLASLt could not be loaded (see ptrain devices above): nothing else can run"
  exit 1
fi
record PASS $((SECONDS - t0)) "the GPU, the CUDA libraries, ptrain devices"

# A small synthetic config for the training steps: 2 layers, width 128, 64 tokens, 10 steps at
# lr 3e-3 from the first step (no warmup), so the loss moves.
small_config() {  # small_config NAME DEVICE MODE STEPS > file
  local name="$1" device="$2" mode="$3" steps="$4" precision
  if [[ "$mode" == *+primary ]]; then
    local recipe="${mode#*:}"
    precision="{mode: fp8, fp8: {recipe: ${recipe%+primary}, primary_weights: true}}"
  elif [[ "$mode" == *:* ]]; then
    precision="{mode: ${mode%%:*}, fp8: {recipe: ${mode#*:}}}"
  else
    precision="{mode: $mode}"
  fi
  cat <<CONFIG
run: {name: $name, out_dir: $work/runs, seed: 3, device: $device, overwrite: true}
model: {n_layer: 2, n_head: 4, n_embd: 128, seq_len: 128, vocab_size: 256}
data: {synthetic: {vocab: 256, order: 2, branching: 4, tokens: 200000, seed: 5}}
training: {steps: $steps, batch_tokens: 1024, micro_batch: 8, eval_every: 0, eval_batches: 2}
optimizer: {lr: 3.0e-3}
schedule: {warmup_steps: 0}
precision: $precision
checkpoint: {save_final: false}
CONFIG
}

# ---------------------------------------------------------------------------- first
run_modes() {
  echo
  echo "== 10 training steps per precision mode, cuda against cpu"
  local mode tag
  for mode in "${modes[@]}"; do
    tag="${mode/:/-}"
    small_config "cuda-$tag" cuda "$mode" 10 >"$work/runs/cuda-$tag.yaml"
    small_config "cpu-$tag" cpu "$mode" 10 >"$work/runs/cpu-$tag.yaml"
    step "train $mode on cuda" "$t_train_cuda" "$limit_train" "$bin/ptrain" train "$work/runs/cuda-$tag.yaml" || continue
    step "train $mode on cpu" "$t_train_cpu" "$limit_train" "$bin/ptrain" train "$work/runs/cpu-$tag.yaml" || continue
    py - "$work/runs/cuda-$tag/metrics.jsonl" \
      "$work/runs/cpu-$tag/metrics.jsonl" "$mode" <<'PY'
import json, sys
def losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if "loss" in r and "step" in r]
gpu, cpu = losses(sys.argv[1]), losses(sys.argv[2])
print(f"{sys.argv[3]}: step  cuda loss    cpu loss     relative difference")
for i, (g, c) in enumerate(zip(gpu, cpu), 1):
    print(f"      {i:4d}  {g:.6f}  {c:.6f}  {abs(g - c) / abs(c):.2e}")
PY
  done
}

# The gpu tests of a group run in one process: a process a test would pay for the CUDA context
# and cuBLASLt's and cuDNN's start once per test (some 5 s each by the estimate above).
# Catch2's XML reporter writes and flushes each test's result as the test ends, so when the
# process crashes or runs out of time the test it was in is known, and the tests after it run
# each in a process of its own. A test that fails runs once more alone with
# CUDA_LAUNCH_BLOCKING=1, so that an asynchronous error is reported by the launch that caused
# it; the summary has both outcomes.

# An awk function undoing the XML reporter's escapes in a test's name.
xml_decode='function decode(s) {
  gsub(/&quot;/, "\"", s); gsub(/&apos;/, "'\''", s); gsub(/&lt;/, "<", s); gsub(/&gt;/, ">", s)
  gsub(/&amp;/, "\\&", s); return s
}'

# test_results XML NAMES: "STATUS<TAB>SECONDS<TAB>NAME" for each test NAMES lists, in order:
# PASS or FAIL with its seconds, RUNNING (started, no result: the process ended in it) or
# UNRUN (never started).
test_results() {
  awk -F'\t' "$xml_decode"'
    FNR == NR {
      if (match($0, /<TestCase name="[^"]*"/)) {
        name = decode(substr($0, RSTART + 16, RLENGTH - 17))
        status[name] = "RUNNING"
      } else if (match($0, /<OverallResult success="[a-z]*"/)) {
        status[name] = index($0, "success=\"true\"") ? "PASS" : "FAIL"
        if (match($0, /durationInSeconds="[0-9.e+-]*"/)) seconds[name] = sprintf("%.1f", substr($0, RSTART + 19, RLENGTH - 20))
      }
      next
    }
    { print ($0 in status ? status[$0] : "UNRUN") "\t" ($0 in seconds ? seconds[$0] : 0) "\t" $0 }
  ' "$1" "$2"
}

failed_test_xml() {  # failed_test_xml XML NAME: the XML reporter's record of test NAME, its failures in it
  awk "$xml_decode"'
    match($0, /<TestCase name="[^"]*"/) { inside = decode(substr($0, RSTART + 16, RLENGTH - 17)) == want }
    inside { print }
    /<\/TestCase>/ { inside = 0 }
  ' want="$2" "$1" | head -100
}

# gpu_test_alone NAME LABEL [VAR=VALUE...]: the test NAME in a process of its own.
gpu_test_alone() {
  local name="$1" label="$2"
  shift 2
  step "gpu test: $name, $label" "$t_alone" "$limit_alone" env "$@" "$bin/ptrain_gpu_tests" "$(catch_filter "$name")" -w NoTests
}

# gpu_test_group WHAT FILTER NAMES EXPECTED LIMIT: the tests FILTER selects (listed in NAMES), as above.
gpu_test_group() {
  local what="$1" filter="$2" names="$3" expected="$4" limit="$5"
  local xml rc status seconds name
  xml="$work/$(slug "$what").xml"
  step "gpu tests: $(wc -l <"$names") $what in one process" "$expected" "$limit" \
    "$bin/ptrain_gpu_tests" "$filter" -w NoTests -r xml -d yes -o "$xml"
  rc=$?
  grep -q '<TestCase ' "$xml" 2>/dev/null || return  # none started: no time, no GPU, no test matched
  while IFS=$'\t' read -r status seconds name; do
    case "$status" in
      PASS) record PASS "$seconds" "gpu test: $name" ;;
      FAIL)
        record FAIL "$seconds" "gpu test: $name"
        failed_test_xml "$xml" "$name" | fail_log "gpu test: $name: its record in the group's XML report"
        gpu_test_alone "$name" "again alone with CUDA_LAUNCH_BLOCKING=1" CUDA_LAUNCH_BLOCKING=1
        ;;
      RUNNING)
        if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
          record TIME "$seconds" "gpu test: $name: running when the group's limit ran out (not run again: it may hang)"
        else
          record FAIL "$seconds" "gpu test: $name: the process ended in it (exit $rc)"
          gpu_test_alone "$name" "again alone with CUDA_LAUNCH_BLOCKING=1" CUDA_LAUNCH_BLOCKING=1
        fi
        ;;
      UNRUN)
        gpu_test_alone "$name" "alone, after the group's process ended" ||
          gpu_test_alone "$name" "again alone with CUDA_LAUNCH_BLOCKING=1" CUDA_LAUNCH_BLOCKING=1
        ;;
    esac
  done < <(test_results "$xml" "$names")
}

run_first() {
  run_modes
  echo
  echo "== the gpu tests"
  gpu_test_group "op and kernel tests" "$ops_filter" "$work/ops-tests.txt" $((t_op_tests + t_op_test * n_ops)) "$limit_op_tests"
  gpu_test_group "training tests" "$train_filter" "$work/train-tests.txt" $((t_train_test * n_train)) "$limit_train_tests"
  echo
  echo "== Hugging Face export loaded by transformers"
  step "hf export vs transformers" "$t_hf" "$limit_hf" scripts/hf-check.sh cuda && cat "$step_log"
  echo
  echo "== ZeRO-0 to ZeRO-3 across GPUs"
  run_multigpu
  run_speed
}

# tests/multigpu on this machine's GPUs: 2 GPUs under mpirun follow 1 GPU on the same global
# batch at every ZeRO stage. It needs two GPUs, a bundle built with MPI
# (PTRAIN_GPU_BUNDLE_MPI=1 scripts/gpu-bundle.sh) and Open MPI's mpirun on the machine; a
# machine short of any of them gets a SKIP line that says which.
run_multigpu() {
  local gpus missing=""
  gpus=$(grep -c '^cuda:[0-9]' "$work/devices.txt")
  if [ "$gpus" -lt 2 ]; then
    record SKIP 0 "ZeRO-0 to ZeRO-3 across GPUs: $gpus GPU on this machine, the step needs 2"
    return
  fi
  [ -x "$bin/ptrain_multigpu_tests" ] || missing="a bundle built with MPI (PTRAIN_GPU_BUNDLE_MPI=1 scripts/gpu-bundle.sh)"
  command -v mpirun >/dev/null || missing="$missing${missing:+ and }mpirun on this machine"
  if [ -n "$missing" ]; then
    record SKIP 0 "ZeRO-0 to ZeRO-3 across GPUs: $gpus GPUs, but the step needs $missing"
    return
  fi
  step "ZeRO-0 to ZeRO-3 on 2 GPUs against 1 (tests/multigpu)" "$t_multigpu" "$limit_multigpu" \
    env PTRAIN_MPIEXEC="$(command -v mpirun)" "$bin/ptrain_multigpu_tests" -w NoTests
}

# ---------------------------------------------------------------------------- speed
bench_field() {  # bench_field LOG KEY N: the Nth field from the end of the last line of LOG holding KEY
  awk -v key="$2" -v n="$3" 'index($0, key) { v = $(NF - n) } END { print v }' "$1"
}
memory_field() {  # memory_field LOG WORD: the field after WORD on bench's "peak device memory" line (peak, plan)
  awk -v word="$2" '/peak device memory/ { for (i = 1; i < NF; ++i) if ($i == word) v = $(i + 1) } END { print v }' "$1"
}

run_speed() {
  echo
  echo "== benchmark rows (medians over steps 2-8; MFU against the data sheet's dense peak)"
  local table="$out/$stage-bench.txt" row label config expected sets s log left=""
  printf '%-30s %10s %9s %7s %9s %9s %-9s %s\n' row "tokens/s" "TFLOP/s" "MFU %" "peak GiB" "plan GiB" attention \
    "native fp8" >"$table"
  timed=true
  while IFS= read -r row; do
    label="${row%%|*}"
    config="$(cut -d'|' -f2 <<<"$row")"
    expected=$(bench_expected "$config")
    if [ -n "$left" ] || ! fits "$expected"; then
      left="$left${left:+; }$label"
      continue
    fi
    sets=()
    for s in $(cut -d'|' -f3 <<<"$row"); do sets+=(--set "$s"); done
    step "bench $label" "$expected" "$limit_bench" "$bin/ptrain" bench "configs/bench-gpu/$config.yaml" \
      --set "run.out_dir=$work/runs" "${sets[@]}"
    log="$step_log"
    printf '%-30s %10s %9s %7s %9s %9s %-9s %s\n' "$label" "$(bench_field "$log" 'tokens/s' 0)" \
      "$(bench_field "$log" 'model FLOP/s' 6)" "$(bench_field "$log" 'MFU, bf16 peak' 1)" \
      "$(memory_field "$log" memory)" "$(memory_field "$log" '(plan')" \
      "$(grep -m1 -o 'attention: [a-z]*' "$log" | cut -d' ' -f2)" \
      "$(grep -m1 -o 'fp8: [0-9]* of [0-9]*' "$log" | cut -d' ' -f2,4 | tr ' ' /)" >>"$table"
  done < <(stage_rows "$stage")
  timed=false
  [ -z "$left" ] || record SKIP 0 "bench rows left for $([ "$stage" = first ] && echo "the speed stage" || echo "another call"): $left"
  echo
  cat "$table"
}

# ---------------------------------------------------------------------------- sanitize
run_sanitize() {
  if ! command -v compute-sanitizer >/dev/null; then
    record FAIL 0 "compute-sanitizer is not on the PATH"
    return
  fi
  compute-sanitizer --version | tail -1
  echo
  echo "== memcheck on short training runs (NVTX regions for the arena's blocks)"
  local mode tag
  for mode in bf16 fp8:current fp8:block; do
    tag="${mode/:/-}"
    small_config "memcheck-$tag" cuda "$mode" 3 >"$work/runs/memcheck-$tag.yaml"
    PTRAIN_KERNEL_LOG="$work/kernels-memcheck.txt" step "memcheck: train $mode" "$t_memcheck" "$limit_memcheck" \
      compute-sanitizer --tool memcheck --nvtx yes --error-exitcode 1 \
      "$bin/ptrain" train "$work/runs/memcheck-$tag.yaml"
  done
  echo
  echo "== racecheck on every backend op and kernel test"
  PTRAIN_KERNEL_LOG="$work/kernels-racecheck.txt" step "racecheck: the op and kernel tests" "$t_racecheck" \
    "$limit_racecheck" compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 1 \
    "$bin/ptrain_gpu_tests" "$ops_filter" -w NoTests

  echo
  echo "== kernels reached"
  local tool missing all
  all=$(kernels_defined kernels | wc -l)
  for tool in memcheck racecheck; do
    missing="$(kernels_not_reached kernels "$work/kernels-$tool.txt")"
    echo "$tool reached $((all - $(grep -c . <<<"$missing"))) of $all kernels${missing:+; not: $(paste -sd ' ' <<<"$missing")}"
  done
  if [ -n "$(kernels_not_reached kernels "$work/kernels-racecheck.txt")" ]; then
    record FAIL 0 "racecheck did not reach every kernel (see the log)"
  else
    record PASS 0 "racecheck reached every kernel"
  fi
}

"run_$stage"
