#!/usr/bin/env bash
# Shows that the simulated device catches the host-code bugs it claims to (outside CI): each
# mutation below is applied to a scratch copy of the tree, the simulated-device tests are built
# and the named ones run; each must fail. Prints CAUGHT or MISSED per mutation; exits 1 if any
# was missed.
set -uo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
scratch="${SIM_MUTATIONS_DIR:-/tmp/ptrain-sim-mutations}"
rm -rf "$scratch"
mkdir -p "$scratch"
git ls-files -z | (cd "$repo" && xargs -0 cp --parents -t "$scratch")
cd "$scratch"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
targets=(ptrain_sim_gpu_tests ptrain_sim_multigpu_tests)
echo "== building the simulated-device tests (scratch copy: $scratch)"
cmake --build build -j "$(nproc)" --target "${targets[@]}" >/dev/null || exit 1

# The tests that should catch the mutations must pass on the tree as it is: otherwise every
# mutation would look caught.
baseline="uploads run ahead|the op table's matmul cases|fused \\(cuDNN\\) attention|GPUs follow 1 GPU|two runs with the same seed|MLP's input stored as FP8 codes"
echo "== the unmutated tree: the sim tests matching '$baseline'"
if ! (cd build && ctest -L sim -R "$baseline" -j "$(nproc)" --timeout 900 --output-on-failure >../baseline.log 2>&1); then
  echo "the unmutated tree fails them (see $scratch/baseline.log): no mutation can be judged"
  exit 1
fi
echo "passed"

missed=0
# mutate NAME FILE PYTHON-REPLACEMENT TEST-REGEX: replaces the first occurrence of OLD by NEW in
# FILE (both exact text, passed to python), rebuilds, runs the tests, restores the file.
mutate() {
  local name="$1" file="$2" old="$3" new="$4" tests="$5"
  cp "$file" "$file.orig"
  if ! python3 - "$file" "$old" "$new" <<'PY'
import sys
path, old, new = sys.argv[1:4]
text = open(path).read()
if old not in text:
    sys.exit(f"the text to mutate is not in {path}: {old!r}")
open(path, "w").write(text.replace(old, new, 1))
PY
  then
    echo "MISSED  $name: the mutation no longer applies (the code moved); update this script"
    missed=$((missed + 1))
    return
  fi
  echo
  echo "== $name ($file)"
  # grep reads the whole listing: with pipefail, grep -q leaving early could fail ctest's write.
  if ! (cd build && ctest -N -L sim -R "$tests" | grep '^ *Test *#' >/dev/null); then
    echo "MISSED  $name: no sim test matches '$tests' (a test was renamed); update this script"
    missed=$((missed + 1))
  elif ! cmake --build build -j "$(nproc)" --target "${targets[@]}" >/dev/null 2>&1; then
    echo "MISSED  $name: the mutated tree does not build"
    missed=$((missed + 1))
  elif (cd build && ctest -L sim -R "$tests" --timeout 900 --output-on-failure >"../$name.log" 2>&1); then
    echo "MISSED  $name: the sim tests matching '$tests' still pass"
    missed=$((missed + 1))
  else
    echo "CAUGHT  $name: $(grep -c '\*\*\*Failed' "$name.log") of the tests matching '$tests' failed"
    grep -m1 -A4 'FAILED:' "$name.log" | sed 's/^/        /'
  fi
  # Restored with a new time stamp: the .orig copy is older than the mutant's object file, and a
  # build that kept the mutant would make every later mutation look caught.
  mv "$file.orig" "$file"
  touch "$file"
}

# 1. A pinned staging buffer handed out again before the copy queued from it ran.
mutate pinned-staging-released-early src/backend/cuda/pinned_staging.cpp \
  '  if (copied_)
    PTRAIN_CUDA_CHECK(cudaEventSynchronize(copied_));
  else
    PTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));' \
  '  if (!copied_) PTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));' \
  'uploads run ahead'

# 2. A GEMM's leading dimensions swapped (A's for B's): wrong wherever they differ (the dgrad and
#    wgrad GEMMs of a layer whose input and output widths differ).
mutate gemm-leading-dimension-swapped src/backend/cuda/matmul.cpp \
  'out.a = make_layout(spec.a_type, spec.a_rows(), spec.a_cols(), spec.ld_a(), spec.batch, spec.stride_a);
  out.b = make_layout(spec.b_type, spec.b_rows(), spec.b_cols(), spec.ld_b(), spec.batch, spec.stride_b);' \
  'out.a = make_layout(spec.a_type, spec.a_rows(), spec.a_cols(), spec.ld_b(), spec.batch, spec.stride_a);
  out.b = make_layout(spec.b_type, spec.b_rows(), spec.b_cols(), spec.ld_a(), spec.batch, spec.stride_b);' \
  "the op table's matmul cases"

# 3. A cuDNN tensor's stride dropped: the output O declared packed per head instead of (B,T,C).
mutate cudnn-tensor-stride-dropped src/backend/cuda/cudnn_attention.cpp \
  'Dims out_strides() const { return {T * C, D, C, 1}; }' \
  'Dims out_strides() const { return {T * C, D, D, 1}; }' \
  'fused \(cuDNN\) attention'

# 4. A cross-stream event wait removed: the compute stream no longer waits for the NCCL stream's
#    sums, so the optimizer reads gradients before the other rank's half is added.
mutate cross-stream-wait-removed src/dist/nccl_communicator.cpp \
  '    PTRAIN_CUDA_CHECK(cudaEventRecord(comm_done_, stream_));
    PTRAIN_CUDA_CHECK(cudaStreamWaitEvent(compute_, comm_done_, 0));' \
  '    PTRAIN_CUDA_CHECK(cudaEventRecord(comm_done_, stream_));' \
  'GPUs follow 1 GPU'

# 5. ZeRO-2's wait for a gradient bucket's sum dropped: the compute stream adds the bucket into
#    the gradient shard while NCCL may still be summing it.
mutate zero2-bucket-wait-removed src/optim/adamw.cpp \
  '  if (!pending_) return;
  comm_->wait();' \
  '  if (!pending_) return;' \
  'GPUs follow 1 GPU'

# 6. ZeRO-3's wait for a prefetched gather dropped: the next block computes with its weight room
#    still holding the block two before it (the gather was queued a block ahead on NCCL's stream).
mutate zero3-gather-wait-removed src/dist/nccl_communicator.cpp \
  '    PTRAIN_CUDA_CHECK(cudaStreamWaitEvent(compute_, gathered_, 0));
    check_async_error();' \
  '    check_async_error();' \
  'GPUs follow 1 GPU'

# 7. ZeRO-3's FP8 layer no longer casts its weight again before its backward pass: the codes it
#    shares with the layers of its shape still hold the last block's forward cast.
mutate zero3-fp8-recast-removed src/model/fp8_linear.cpp \
  '  if (recast_weight_) cast(weight_, Fp8Gemms::kWeight, weight_q_, weight, block, block, /*training=*/true);' \
  '' \
  'GPUs follow 1 GPU'

# 8. Under recompute: mlp the down projection no longer casts its recomputed input: its
#    weight-gradient GEMM reads the input codes the MLP slot still holds from the block above.
mutate recompute-mlp-input-recast-removed src/model/transformer.cpp \
  '  if (Fp8Linear* down = fp8_linear(l, kFcproj)) down->recast_input(a_.fch_gelu[hidden_slot(l)]);' \
  '' \
  'two runs with the same seed'

# 9. The output projection no longer casts its input again before its backward pass: its
#    weight-gradient GEMM reads the codes its slot still holds from the last block.
mutate out-projection-input-recast-removed src/model/transformer.cpp \
  '      if (Fp8Linear* proj = fp8_linear(l, kAttproj)) proj->recast_input(a_.atty[block_slot(l)]);' \
  '' \
  'two runs with the same seed'

# 10. With the MLP's input stored as FP8 codes, the down projection no longer casts the input made
#     again from them before its backward pass: its weight-gradient GEMM reads the codes its
#     shared slot still holds from the last block.
mutate mlp-codes-down-recast-removed src/model/transformer.cpp \
  '  down->recast_input(a_.fch_gelu[hidden_slot(l)]);' \
  '' \
  "MLP's input stored as FP8 codes"

# 11. Primary FP8 weights under ZeRO-1: the compute stream no longer waits for the codes' gathers,
#     so the forward pass reads layers whose other ranks' parts NCCL has not written yet.
mutate primary-codes-gather-wait-removed src/optim/adamw.cpp \
  '  comm_->wait_gathers();
  comm_->all_reduce_sum(counts.data(), counts.size());' \
  '  comm_->all_reduce_sum(counts.data(), counts.size());' \
  'GPUs follow 1 GPU'

# 12. Primary FP8 weights under ZeRO-3: every block's codes gathered into one code room, so the
#     next block's gather, running beside this block's GEMMs, overwrites the codes they read.
mutate primary-codes-one-room src/model/transformer.cpp \
  '  return room.range(layer % rooms * per_layer, per_layer);' \
  '  return room.range(0, per_layer);' \
  'GPUs follow 1 GPU'
echo
[ "$missed" -eq 0 ] && echo "every mutation was caught" || echo "$missed mutation(s) missed"
[ "$missed" -eq 0 ]
