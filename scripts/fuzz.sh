#!/usr/bin/env bash
# Builds the libFuzzer targets (build-fuzz/, clang, AddressSanitizer + UBSan) and runs each for
# SECONDS (default 30), two at a time: first over its committed corpus (tests/fuzz/corpus/NAME,
# the seeds and every crash input found so far), then fuzzing. Fails on any crash, sanitizer
# report, timeout (-timeout) or out-of-memory (-rss_limit_mb), leaving the input in
# build-fuzz/artifacts/. New inputs go to build-fuzz/corpus/, never into the committed corpus.
#   ./scripts/fuzz.sh             # 30 s per target (CI)
#   ./scripts/fuzz.sh 3600 state  # one target for an hour
# A crash input found belongs in tests/fuzz/corpus/NAME/ (with the fix), as a regression case.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config set_override shard safetensors state llmc tokenizer tokenizer_json hf_config hf_index)

# The build's output is kept and printed only when it fails (CI would otherwise show a bare exit 1).
mkdir -p build-fuzz
if ! { CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DPTRAIN_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo &&
       cmake --build build-fuzz -j "$(nproc)"; } >build-fuzz/build.log 2>&1; then
  grep -E -B2 -A6 'error|FAILED' build-fuzz/build.log | head -80 || tail -40 build-fuzz/build.log
  echo "FAIL: the fuzz targets did not build (build-fuzz/build.log)"
  exit 1
fi
mkdir -p build-fuzz/artifacts build-fuzz/logs

run_one() {
  local name="$1" seeds="tests/fuzz/corpus/$1" work="build-fuzz/corpus/$1" log="build-fuzz/logs/$1.txt"
  mkdir -p "$work"
  # -runs=0 replays the committed corpus (regression cases) before any fuzzing.
  "build-fuzz/tests/fuzz/fuzz_$name" -runs=0 "$seeds" >"$log" 2>&1 &&
    "build-fuzz/tests/fuzz/fuzz_$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="build-fuzz/artifacts/$name-" "$work" "$seeds" >>"$log" 2>&1
}

failed=0
pids=() names=()
for name in "${targets[@]}"; do
  run_one "$name" & pids+=($!) names+=("$name")
  if [ ${#pids[@]} -eq 2 ]; then
    for i in 0 1; do wait "${pids[$i]}" || { echo "FAIL: fuzz_${names[$i]} (build-fuzz/logs/${names[$i]}.txt)"; failed=1; }; done
    pids=() names=()
  fi
done
for i in "${!pids[@]}"; do wait "${pids[$i]}" || { echo "FAIL: fuzz_${names[$i]} (build-fuzz/logs/${names[$i]}.txt)"; failed=1; }; done

printf '%-14s %12s %10s %8s\n' target executions exec/s corpus
for name in "${targets[@]}"; do
  log="build-fuzz/logs/$name.txt"
  runs=$(awk '/stat::number_of_executed_units:/ {n = $2} END {print n}' "$log")
  rate=$(awk '/stat::average_exec_per_sec:/ {n = $2} END {print n}' "$log")
  corpus=$(ls "build-fuzz/corpus/$name" | wc -l)
  printf '%-14s %12s %10s %8s\n' "$name" "${runs:-?}" "${rate:-?}" "$corpus"
done
if [ "$failed" -ne 0 ]; then
  for f in build-fuzz/artifacts/*; do [ -e "$f" ] && echo "crash input: $f"; done
  for name in "${targets[@]}"; do grep -A30 -m1 -E 'ERROR: |==[0-9]+==|deadly signal|Timeout|out-of-memory' "build-fuzz/logs/$name.txt" || true; done
  exit 1
fi
