#!/usr/bin/env bash
# Line coverage of the CUDA backend by the tests on the simulated device (outside CI): builds
# the simulated-device targets with gcov instrumentation into build-sim-coverage/, runs every
# test labelled `sim` (or the ctest regex given), and prints the share of lines executed in each
# file of src/backend/cuda and in src/dist/nccl_communicator.cpp, then the total.
# The NCCL communicator is compiled into the simulated build when MPI is installed (NCCL is
# simulated over it); without MPI it is listed as not built.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
build=build-sim-coverage
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPTRAIN_MPI=AUTO \
  -DCMAKE_CXX_FLAGS="--coverage -O1" -DCMAKE_EXE_LINKER_FLAGS=--coverage >/dev/null
cmake --build "$build" -j "$(nproc)" --target ptrain_sim_gpu_tests ptrain_sim_tests ptrain_simulated \
  $(grep -q ptrain_sim_multigpu_tests "$build/build.ninja" && echo ptrain_sim_multigpu_tests ptrain_sim_run_tests)
find "$build" -name '*.gcda' -delete
(cd "$build" && ctest -L sim --output-on-failure ${1:+-R "$1"}) || echo "(some sim tests failed; coverage below is of what ran)"

objects="$build/tests/CMakeFiles/ptrain_sim_lib.dir"
report="$(mktemp)"
trap 'rm -f "$report"' EXIT
(cd "$objects" && find . -name '*.gcda' | while read -r gcda; do gcov -n -o "$(dirname "$gcda")" "$gcda" 2>/dev/null; done) >"$report"
echo
echo "== line coverage on the simulated device"
awk '
  /^File / { file = $2; gsub(/\x27/, "", file) }
  /^Lines executed:/ {
    split($2, a, "%"); pct = substr(a[1], index(a[1], ":") + 1); n = $NF
    sub(/.*\/src\//, "src/", file)
    if (file ~ /^src\/backend\/cuda\/|^src\/dist\/nccl_communicator.cpp/ && !(file in seen)) {
      seen[file] = 1
      printf "%6.1f%% of %5d lines  %s\n", pct, n, file
      run += pct * n / 100; total += n
    }
  }
  END { if (total) printf "%6.1f%% of %5d lines  total\n", 100 * run / total, total }
' "$report" | sort -k5
grep -q "nccl_communicator" "$report" || echo "   not built  src/dist/nccl_communicator.cpp (no MPI: NCCL is not simulated)"
