#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test through ctest, in phases:
#   tests             every test but those on the simulated device, nproc at once: most start
#                     ptrain with one thread or wait on its processes, and the multi-threaded
#                     ones give the same results at any thread count, so sharing the cores costs
#                     them time, never a result
#   sim tests         the simulated device's (label sim), nproc at once: each runs on one core
#                     (the SIMT emulator runs one block at a time)
#   second numerics   every test that runs the CPU backend again, with each CPU GEMM result
#                     moved by up to one ulp as another CPU's BLAS could round it (label
#                     second-numerics; PTRAIN_GEMM_ULP_SEED): a test that holds only on this
#                     machine's rounding fails here, not on the next machine; nproc at once
#                     (two side by side took 337 s here, one by one 457 s in the last CI run)
#   ASan              the kernel tests built again with AddressSanitizer (kernels run on the CPU
#                     under the SIMT emulator, so an out-of-bounds access in a kernel shows up)
#   fuzzers           every fuzzer for 30 s (scripts/fuzz.sh)
# and prints each phase's time at the end (also when a phase fails). Arguments go to one ctest
# run instead (e.g. -R layernorm), and skip the phases.
set -euo pipefail
cd "$(dirname "$0")/.."

timings=()
report() {
  [ ${#timings[@]} -gt 0 ] || return 0
  echo
  echo "== phase times"
  printf '  %s\n' "${timings[@]}"
}
trap report EXIT
phase() {  # phase NAME COMMAND...: runs COMMAND, records its time (and failure)
  local name="$1" t0=$SECONDS rc=0
  shift
  echo "== $name"
  "$@" || rc=$?
  timings+=("$(printf '%-16s %5d s%s' "$name" $((SECONDS - t0)) "$([ $rc -eq 0 ] || echo ", failed (exit $rc)")")")
  return $rc
}
in_build() { (cd "$1" && shift && "$@"); }

phase build ./scripts/build.sh
# build.sh's install step (scripts/install-deps.sh) installs Chromium: the report test must find it.
export PTRAIN_REQUIRE_CHROMIUM=1
# Two tests at once share the cores: OpenMP's idle threads then sleep instead of spinning, or a
# test's spinning threads take the core its neighbour needs (measured here: two CPU training
# tests side by side took 93 s spinning, 21 s passive; one alone no slower). Results are the
# same at any wait policy.
export OMP_WAIT_POLICY=PASSIVE
if [ $# -gt 0 ]; then
  in_build build ctest --output-on-failure --no-tests=error "$@"
  exit 0
fi
phase tests in_build build ctest --output-on-failure --no-tests=error -LE '^(sim|second-numerics)$' -j "$(nproc)"
phase "sim tests" in_build build ctest --output-on-failure --no-tests=error -L '^sim$' -j "$(nproc)"
phase "second numerics" in_build build ctest --output-on-failure --no-tests=error -L '^second-numerics$' -j "$(nproc)"

# Chained: inside `phase`, set -e does not stop a function, and a stale build must not be tested.
asan() {
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release -DPTRAIN_ASAN=ON -DPTRAIN_CUDA=OFF >/dev/null &&
    cmake --build build-asan -j "$(nproc)" --target ptrain_kernel_tests &&
    in_build build-asan ctest --output-on-failure --no-tests=error -R '^kernels/' -j "$(nproc)"
}
phase ASan asan
phase fuzzers ./scripts/fuzz.sh 30
