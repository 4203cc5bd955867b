#!/usr/bin/env bash
# Line coverage of the CUDA backend by the tests on the simulated device (outside CI): builds
# the simulated-device targets with gcov instrumentation into build-sim-coverage/, runs every
# test labelled `sim` (or the ctest regex given), and prints the share of lines executed in each
# file of src/backend/cuda and in src/dist/nccl_communicator.cpp, the line ranges never
# executed, then the total. A header's lines count once, executed if any translation unit that
# includes it executed them (gcov's JSON per unit, merged).
# The NCCL communicator is compiled into the simulated build when MPI is installed (NCCL is
# simulated over it); without MPI it is listed as not built.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
build=build-sim-coverage
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPTRAIN_MPI=AUTO \
  -DCMAKE_CXX_FLAGS="--coverage -O1" -DCMAKE_EXE_LINKER_FLAGS=--coverage >/dev/null
cmake --build "$build" -j "$(nproc)" --target ptrain_sim_gpu_tests ptrain_sim_tests ptrain_sim_backend_tests \
  ptrain_simulated $(grep -q ptrain_sim_multigpu_tests "$build/build.ninja" && echo ptrain_sim_multigpu_tests ptrain_sim_run_tests)
find "$build" -name '*.gcda' -delete
# gcov merges the counts of concurrent test processes into each .gcda under a file lock.
(cd "$build" && ctest -L sim -j "$(nproc)" --output-on-failure ${1:+-R "$1"}) ||
  echo "(some sim tests failed; coverage below is of what ran)"

report="$(mktemp)"
trap 'rm -f "$report"' EXIT
find "$build/tests/CMakeFiles/ptrain_sim_lib.dir" -name '*.gcda' | while read -r gcda; do
  gcov --json-format --stdout -o "$(dirname "$gcda")" "$gcda" 2>/dev/null
done >"$report"
echo
echo "== line coverage on the simulated device (missed: line ranges never executed)"
python3 - "$report" <<'PY'
import collections, json, re, sys
executed = collections.defaultdict(dict)  # file -> line -> executed in some unit
for text in open(sys.argv[1]):
    if not text.strip():
        continue
    for f in json.loads(text)["files"]:
        m = re.search(r"(src/backend/cuda/[^/]+|src/dist/nccl_communicator\.cpp)$", f["file"])
        if not m:
            continue
        lines = executed[m.group(1)]
        for line in f["lines"]:
            lines[line["line_number"]] = lines.get(line["line_number"], False) or line["count"] > 0
run = total = 0
for name in sorted(executed):
    lines = executed[name]
    ran = sum(lines.values())
    run, total = run + ran, total + len(lines)
    ranges = []
    for n in sorted(n for n, e in lines.items() if not e):
        if ranges and n == ranges[-1][1] + 1:
            ranges[-1][1] = n
        else:
            ranges.append([n, n])
    missed = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)
    print(f"{100 * ran / len(lines):6.1f}% of {len(lines):5d} lines  {name}" + (f"  missed: {missed}" if missed else ""))
print(f"{100 * run / total:6.1f}% of {total:5d} lines  total")
if "src/dist/nccl_communicator.cpp" not in executed:
    print("   not built  src/dist/nccl_communicator.cpp (no MPI: NCCL is not simulated)")
PY
