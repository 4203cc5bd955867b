#!/usr/bin/env bash
# What ptrain checks on a borrowed H100/H200, in three stages of one device call each (a call
# may run 10 minutes; a lease is 15 in all). Nothing is built there: scripts/gpu-bundle.sh builds
# here and the call carries .gpu-bundle/.
#
#   scripts/gpu-check.sh correctness     first contact: the device and library versions, every
#                                        `gpu` test in its own process, one short training run
#                                        per precision mode against the CPU, loss by loss
#   scripts/gpu-check.sh speed [REGEX]   the benchmark table; REGEX keeps the rows whose label
#                                        ("124m bf16", "124m fp8 recipe=block", ...) matches
#   scripts/gpu-check.sh sanitize        compute-sanitizer: memcheck (with the arena's blocks
#                                        registered through NVTX) on short training runs,
#                                        racecheck on every backend op test, and which of the
#                                        kernels each reached
#   scripts/gpu-check.sh --plan [STAGE]  what each stage runs and its limits; needs no GPU
#
# Results go to $OUT (the device tool's output folder; ./gpu-check-out elsewhere) as they come:
# STAGE.log (everything printed), STAGE-summary.txt (a line per step: PASS, FAIL, TIME (its
# limit ran out), SKIP, with seconds), and at the end, or when the stage is stopped by a signal,
# STAGE-library-choices.jsonl (what cuBLASLt and cuDNN accepted, refused and chose for every
# GEMM and attention graph the stage ran: PTRAIN_LIBRARY_LOG) and STAGE-details.tar.gz (each
# step's log and metrics, the kernels each step launched). A stage starts no step its budget
# (GPU_CHECK_BUDGET seconds, default 540) cannot hold, and says which it left out.
# Exit status: 0 when every step that ran passed.
set -uo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"

usage() { sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }

plan=false
if [ "${1:-}" = "--plan" ]; then
  plan=true
  shift
fi
stage="${1:-}"
[ $# -gt 0 ] && shift
if $plan; then
  case "$stage" in "" | correctness | speed | sanitize) ;; *) usage ;; esac
else
  case "$stage" in correctness | speed | sanitize) ;; *) usage ;; esac
fi
speed_filter="${1:-.}"
budget="${GPU_CHECK_BUDGET:-540}"
modes=(fp32 bf16 fp16 fp8:delayed fp8:current fp8:block)

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
  "350m bf16|gpt2-350m|precision.mode=bf16"
  "350m fp8 recipe=current|gpt2-350m|precision.mode=fp8 precision.fp8.recipe=current"
  "774m bf16|gpt2-774m|precision.mode=bf16"
  "774m fp8 recipe=current|gpt2-774m|precision.mode=fp8 precision.fp8.recipe=current"
  "llama 125m bf16|llama-125m|precision.mode=bf16"
  "llama 125m fp8 recipe=current|llama-125m|precision.mode=fp8 precision.fp8.recipe=current"
  "llama 350m bf16|llama-350m|precision.mode=bf16"
  "llama 1b bf16|llama-1b|precision.mode=bf16"
  "llama 1b fp8 recipe=current|llama-1b|precision.mode=fp8 precision.fp8.recipe=current"
)

# ---------------------------------------------------------------------------- --plan
print_plan() {
  local s="$1"
  case "$s" in
    correctness)
      echo "correctness (budget ${budget}s): learns whether ptrain runs at all on this GPU"
      echo "  1. device: nvidia-smi; ptrain devices (driver, CUDA runtime, cuBLASLt, cuDNN, NCCL loaded vs the build's headers)"
      echo "  2. each test of ptrain_gpu_tests in its own process, 150 s each, ops before training:"
      echo "     the backend op by op against the CPU, the kernels, one micro-batch's gradients, 10 steps per mode,"
      echo "     same-seed determinism, CUDA graphs; a test that skips on a GPU machine is a failure"
      echo "  3. one 10-step training run per precision mode (${modes[*]}) on cuda and on cpu, 90 s each,"
      echo "     printed step by step with the relative difference"
      echo "  4. scripts/hf-check.sh cuda: a tiny gpt2 and llama trained on cuda, exported with --format hf, loaded by"
      echo "     transformers, logits against ptrain's within 1e-4 (exit 77, a failure here, when transformers is missing)"
      ;;
    speed)
      echo "speed (budget ${budget}s): ptrain bench, medians over steps 2-8, 90 s a row; rows matching '${speed_filter}':"
      local row
      for row in "${bench_rows[@]}"; do
        [[ "${row%%|*}" =~ $speed_filter ]] && echo "  ${row%%|*}  (configs/bench-gpu/$(cut -d'|' -f2 <<<"$row").yaml --set $(cut -d'|' -f3 <<<"$row"))"
      done
      ;;
    sanitize)
      echo "sanitize (budget ${budget}s): compute-sanitizer, which the SIMT emulator cannot replace"
      echo "  1. memcheck --nvtx yes (arena blocks registered as NVTX regions, so a write past a block is seen)"
      echo "     on 3-step training runs: bf16 (fused attention), fp8 current, fp8 block; 150 s each"
      echo "  2. racecheck on every backend op and kernel test (ptrain_gpu_tests '[gpu]~[train]', one"
      echo "     comma-free filter, -w NoTests so a filter matching nothing fails), 300 s"
      echo "  3. the kernels each tool reached (PTRAIN_KERNEL_LOG) against every __global__ in kernels/"
      ;;
  esac
}

if $plan; then
  echo "gpu-check plan: each stage is one device call; carry .gpu-bundle (scripts/gpu-bundle.sh); results in \$OUT"
  for s in correctness speed sanitize; do
    [ -z "$stage" ] || [ "$stage" = "$s" ] || continue
    echo
    print_plan "$s"
  done
  exit 0
fi

# ---------------------------------------------------------------------------- results
out="${OUT:-$repo/gpu-check-out}"
mkdir -p "$out"
work="$(mktemp -d /tmp/ptrain-gpu-check.XXXXXX)"
mkdir -p "$work/logs" "$work/runs"
summary="$out/$stage-summary.txt"
: >"$summary"
exec > >(tee -a "$out/$stage.log") 2>&1
start=$(date +%s)
deadline=$((start + budget))
failures=0

export PTRAIN_LIBRARY_LOG="$work/library-choices.jsonl"
export PTRAIN_KERNEL_LOG="$work/kernels-launched.txt"

record() {  # record RESULT SECONDS TEXT: one summary line, written at once
  printf '%-5s %5ss  %s\n' "$1" "$2" "$3" | tee -a "$summary"
  case "$1" in FAIL | TIME) failures=$((failures + 1)) ;; esac
}

finish() {
  trap - EXIT TERM INT
  tar -C "$work" --exclude=./bundle -czf "$out/$stage-details.tar.gz" . 2>/dev/null
  [ -f "$PTRAIN_LIBRARY_LOG" ] && cp "$PTRAIN_LIBRARY_LOG" "$out/$stage-library-choices.jsonl"
  rm -rf "$work"
  echo
  echo "== $stage: summary ($(($(date +%s) - start)) s of ${budget})"
  cat "$summary"
  echo "details: $out/$stage-details.tar.gz"
}
trap 'finish; exit $(( failures > 0 ))' EXIT
trap 'record FAIL 0 "stopped by a signal"; exit 1' TERM INT

slug() { tr -c 'A-Za-z0-9._-' '_' <<<"$1" | cut -c1-80; }

# step NAME LIMIT COMMAND...: runs COMMAND under min(LIMIT, what the budget has left), its output
# in logs/NAME.log (the last 25 lines printed when it fails); exit 77 (a test that found no GPU)
# counts as a failure here.
step() {
  local name="$1" limit="$2"
  shift 2
  local left=$((deadline - $(date +%s) - 20))
  if [ "$left" -lt 15 ]; then
    record SKIP 0 "$name: the stage's ${budget}-second budget is spent"
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  local log="$work/logs/$(slug "$name").log" t0
  t0=$(date +%s)
  timeout -k 5 "$limit" "$@" >"$log" 2>&1
  local rc=$? took=$(($(date +%s) - t0))
  case $rc in
    0) record PASS "$took" "$name" ;;
    124 | 137) record TIME "$took" "$name: over its ${limit}-second limit"; tail -25 "$log" ;;
    77) record FAIL "$took" "$name: skipped on a machine with a GPU"; tail -25 "$log" ;;
    *) record FAIL "$took" "$name (exit $rc)"; tail -25 "$log" ;;
  esac
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

echo "== $stage on $(hostname) at $(date -u +%H:%M:%SZ), budget ${budget}s"
print_plan "$stage"
echo
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1
sed -n '2,3p' "$work/bundle/MANIFEST"
cp "$work/bundle/MANIFEST" "$work/"
if ! "$bin/ptrain" devices >"$work/devices.txt" 2>&1; then
  cat "$work/devices.txt"
  record FAIL 0 "ptrain devices failed: the bundle does not run here"
  exit 1
fi
cat "$work/devices.txt"
if grep -q "no usable CUDA device" "$work/devices.txt"; then
  record FAIL 0 "no usable CUDA device: nothing else can run"
  exit 1
fi

# A small synthetic config for the training steps: 2 layers, width 128, 64 tokens, 10 steps at
# lr 3e-3 from the first step (no warmup), so the loss moves.
small_config() {  # small_config NAME DEVICE MODE STEPS > file
  local name="$1" device="$2" mode="$3" steps="$4" precision
  if [[ "$mode" == *:* ]]; then
    precision="{mode: ${mode%%:*}, fp8: {recipe: ${mode#*:}}}"
  else
    precision="{mode: $mode}"
  fi
  cat <<CONFIG
run: {name: $name, out_dir: $work/runs, seed: 3, device: $device, overwrite: true}
model: {n_layer: 2, n_head: 4, n_embd: 128, seq_len: 64, vocab_size: 256}
data: {synthetic: {vocab: 256, order: 2, branching: 4, tokens: 200000, seed: 5}}
training: {steps: $steps, batch_tokens: 1024, micro_batch: 8, eval_every: 0, eval_batches: 2}
optimizer: {lr: 3.0e-3}
schedule: {warmup_steps: 0}
precision: $precision
checkpoint: {save_final: false}
CONFIG
}

# ---------------------------------------------------------------------------- correctness
run_correctness() {
  echo
  echo "== the gpu tests, one process each"
  local name
  while IFS= read -r name; do
    [ -n "$name" ] || continue
    step "gpu test: $name" 150 "$bin/ptrain_gpu_tests" "$name" -w NoTests
  done < <("$bin/ptrain_gpu_tests" --list-test-names-only "[gpu]~[train]"; "$bin/ptrain_gpu_tests" --list-test-names-only "[train]")

  echo
  echo "== 10 training steps per precision mode, cuda against cpu"
  local mode tag
  for mode in "${modes[@]}"; do
    tag="${mode/:/-}"
    for device in cuda cpu; do
      small_config "$device-$tag" "$device" "$mode" 10 >"$work/runs/$device-$tag.yaml"
      step "train $mode on $device" 90 "$bin/ptrain" train "$work/runs/$device-$tag.yaml" || continue 2
    done
    python3 - "$work/runs/cuda-$tag/metrics.jsonl" "$work/runs/cpu-$tag/metrics.jsonl" "$mode" <<'PY'
import json, sys
def losses(path):
    return [r["loss"] for r in map(json.loads, open(path)) if "loss" in r and "step" in r]
gpu, cpu = losses(sys.argv[1]), losses(sys.argv[2])
print(f"{sys.argv[3]}: step  cuda loss    cpu loss     relative difference")
for i, (g, c) in enumerate(zip(gpu, cpu), 1):
    print(f"      {i:4d}  {g:.6f}  {c:.6f}  {abs(g - c) / abs(c):.2e}")
PY
  done

  echo
  echo "== Hugging Face export loaded by transformers"
  step "hf export vs transformers" 150 scripts/hf-check.sh cuda && cat "$work/logs/$(slug "hf export vs transformers").log"
}

# ---------------------------------------------------------------------------- speed
run_speed() {
  echo
  echo "== benchmark rows matching '$speed_filter' (medians over steps 2-8; MFU against the data sheet's dense peak)"
  local table="$work/bench-table.txt" row label config sets log
  printf '%-30s %10s %9s %7s %9s %-9s %s\n' row "tokens/s" "TFLOP/s" "MFU %" "peak GiB" attention "native fp8" >"$table"
  for row in "${bench_rows[@]}"; do
    label="${row%%|*}"
    [[ "$label" =~ $speed_filter ]] || continue
    config="$(cut -d'|' -f2 <<<"$row")"
    sets=()
    for s in $(cut -d'|' -f3 <<<"$row"); do sets+=(--set "$s"); done
    step "bench $label" 90 "$bin/ptrain" bench "configs/bench-gpu/$config.yaml" --set "run.out_dir=$work/runs" "${sets[@]}"
    log="$work/logs/$(slug "bench $label").log"
    field() { awk -v key="$1" 'index($0, key) { print $(NF - ($2)) }' "$log" | tail -1; }
    printf '%-30s %10s %9s %7s %9s %-9s %s\n' "$label" "$(field 'tokens/s' 0)" "$(field 'model FLOP/s' 6)" "$(field 'MFU' 1)" \
      "$(field 'peak device memory' 1)" "$(grep -m1 -o 'attention: [a-z]*' "$log" | cut -d' ' -f2)" \
      "$(grep -m1 -o 'fp8: [0-9]* of [0-9]*' "$log" | cut -d' ' -f2,4 | tr ' ' /)" >>"$table"
    cat "$table" >"$out/speed-table.txt"
  done
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
    PTRAIN_KERNEL_LOG="$work/kernels-memcheck.txt" step "memcheck: train $mode" 150 \
      compute-sanitizer --tool memcheck --nvtx yes --error-exitcode 1 \
      "$bin/ptrain" train "$work/runs/memcheck-$tag.yaml"
  done
  echo
  echo "== racecheck on every backend op and kernel test"
  PTRAIN_KERNEL_LOG="$work/kernels-racecheck.txt" step "racecheck: the op and kernel tests" 300 \
    compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 1 \
    "$bin/ptrain_gpu_tests" "[gpu]~[train]" -w NoTests

  echo
  echo "== kernels reached"
  grep -h -A2 '__global__' kernels/*.cuh | grep -o '[a-z0-9_]*_kernel' | sort -u >"$work/kernels-all.txt"
  local tool reached missing
  for tool in memcheck racecheck; do
    reached="$(sed 's/<.*//' "$work/kernels-$tool.txt" 2>/dev/null | sort -u)"
    missing="$(comm -23 "$work/kernels-all.txt" <(echo "$reached"))"
    echo "$tool reached $(echo "$reached" | grep -c . ) of $(wc -l <"$work/kernels-all.txt") kernels${missing:+; not: $(echo $missing)}"
  done
  reached="$(sed 's/<.*//' "$work/kernels-racecheck.txt" 2>/dev/null | sort -u)"
  if [ -n "$(comm -23 "$work/kernels-all.txt" <(echo "$reached"))" ]; then
    record FAIL 0 "racecheck did not reach every kernel (see above)"
  else
    record PASS 0 "racecheck reached every kernel"
  fi
}

"run_$stage"
