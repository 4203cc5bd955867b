#!/usr/bin/env bash
# CPU benchmark: builds, then trains configs/bench-cpu.yaml for 20 steps and prints median
# ms/step, tokens/s and model FLOP/s over steps 2-20 beside the machine's sgemm ceiling
# (measured in the same run, same BLAS, same thread count), and where a step's time goes per op
# family and GEMM shape (--profile). The same profile on one thread then gives each family's
# speed-up from the threads (a family near 1x would be a serial phase).
#
# Where Debian's python3-torch is installed, a nanoGPT-style model of the same shape
# (scripts/bench_pytorch.py, FP32) runs interleaved with ptrain, PTRAIN_BENCH_ROUNDS rounds
# (default 3), same threads, and the ratio of their median step times is printed.
#
# Extra arguments go to ptrain, e.g. --set training.threads=1 --set precision.mode=bf16.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
threads=$(nproc)
for arg in "$@"; do
  [[ $arg == training.threads=* && ${arg#*=} != 0 ]] && threads=${arg#*=}
done
export OMP_NUM_THREADS=$threads

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
./build/ptrain bench configs/bench-cpu.yaml --profile "$@" --set training.threads="$threads" | tee "$out/threads.txt"
# "  <family>   <ms> ms   <share> %" lines (the GEMM shapes' lines are indented further).
families() { sed -n 's/^  \([^ ].*[^ ]\)  *\([0-9.][0-9.]*\) ms  *[0-9.][0-9.]* %.*/\1|\2/p' "$1"; }
if [[ $threads -gt 1 ]]; then
  OMP_NUM_THREADS=1 ./build/ptrain bench configs/bench-cpu.yaml --profile "$@" --set training.threads=1 > "$out/one.txt"
  echo
  echo "speed-up from $threads threads, per op family (median ms per step):"
  families "$out/one.txt" > "$out/one.rows"
  families "$out/threads.txt" | while IFS='|' read -r family ms; do
    one=$(awk -F'|' -v f="$family" '$1 == f {print $2}' "$out/one.rows")
    if [[ -n $one ]]; then
      awk -v f="$family" -v a="$one" -v b="$ms" -v t="$threads" \
        'BEGIN {printf "  %-32s %9.1f ms on 1 thread, %9.1f on %d: %5.2fx\n", f, a, b, t, (b > 0 ? a / b : 0)}'
    fi
  done
fi

if ! /usr/bin/python3 -c 'import torch' 2>/dev/null; then
  echo "pytorch comparison: skipped (no python3-torch; apt-get install python3-torch)"
  exit 0
fi
rounds=${PTRAIN_BENCH_ROUNDS:-3}
ptrain_ms=() torch_ms=()
echo
for ((r = 1; r <= rounds; r++)); do
  p=$(./build/ptrain bench configs/bench-cpu.yaml "$@" --set training.threads="$threads" | awk '/median step/ {print $3}')
  t=$(/usr/bin/python3 scripts/bench_pytorch.py --threads "$threads" | sed -n 's/.*median step \([0-9.]*\) ms.*/\1/p')
  echo "round $r: ptrain $p ms/step, pytorch $t ms/step"
  ptrain_ms+=("$p") torch_ms+=("$t")
done
median() { printf '%s\n' "$@" | sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
p=$(median "${ptrain_ms[@]}") t=$(median "${torch_ms[@]}")
echo "interleaved, $threads threads, medians of $rounds rounds: ptrain $p ms/step, pytorch (fp32) $t ms/step:" \
     "ptrain $(awk -v p="$p" -v t="$t" 'BEGIN {printf "%.2f", t / p}')x faster"
