#!/usr/bin/env bash
# Reads ptxas's -v reports (from scripts/nvcc-report.sh) and prints one line per kernel:
# registers, static shared memory, stack frame, spills. Fails if any kernel spills or uses local
# memory (stack), if a report is empty, or if a __global__ kernel of kernels/*.cuh is missing
# from the reports (so a kernel that nvcc never compiled cannot pass unnoticed).
# Usage: check-ptxas.sh KERNELS_DIR REPORT...
set -euo pipefail
kernels_dir="$1"
shift
[ $# -gt 0 ] || { echo "check-ptxas: no report files given" >&2; exit 2; }
for report in "$@"; do
  [ -s "$report" ] || { echo "check-ptxas: $report is missing or empty (was the kernel object built?)" >&2; exit 1; }
done

table="$(cat "$@" | awk '
  /Compiling entry function/ { match($0, /'"'"'[^'"'"']+'"'"'/); name = substr($0, RSTART + 1, RLENGTH - 2);
                               match($0, /for '"'"'sm_[0-9a-z]+'"'"'/); arch = substr($0, RSTART + 5, RLENGTH - 6) }
  /bytes stack frame/ { stack = $1; spill_st = $5; spill_ld = $9 }
  /Used [0-9]+ registers/ {
    regs = $5; smem = 0; lmem = 0
    if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART, RLENGTH) + 0
    if (match($0, /[0-9]+ bytes lmem/)) lmem = substr($0, RSTART, RLENGTH) + 0
    print name "\t" arch "\t" regs "\t" smem "\t" stack "\t" spill_st "\t" spill_ld "\t" lmem
  }')"
[ -n "$table" ] || { echo "check-ptxas: no kernels found in the reports" >&2; exit 1; }

status=0
printf "%-72s %-6s %5s %6s %6s %7s\n" kernel arch regs smem stack spills
while IFS=$'\t' read -r mangled arch regs smem stack spill_st spill_ld lmem; do
  name="$(echo "$mangled" | c++filt | sed -E 's/^void //; s/^ptrain::kernels:://; s/\(.*$//; s/__nv_bfloat16/bf16/g; s/__half/fp16/g')"
  printf "%-72s %-6s %5s %6s %6s %7s\n" "$name" "$arch" "$regs" "$smem" "$stack" "$((spill_st + spill_ld))"
  if [ "$stack" -ne 0 ] || [ "$spill_st" -ne 0 ] || [ "$spill_ld" -ne 0 ] || [ "$lmem" -ne 0 ]; then
    echo "  FAIL: $name uses local memory (stack $stack, spill stores $spill_st, loads $spill_ld, lmem $lmem)" >&2
    status=1
  fi
done <<<"$table"

# Every __global__ function declared in the kernel headers must appear in the reports.
for kernel in $(grep -h -o -E '__global__ void( __launch_bounds__\([^)]*\))? [a-z_0-9]+' "$kernels_dir"/*.cuh | awk '{print $NF}' | sort -u); do
  if ! grep -q -E "[0-9]${kernel}(I|E)" <<<"$(cut -f1 <<<"$table")"; then
    echo "  FAIL: kernel $kernel is in $kernels_dir but not in any ptxas report (add its launcher to instantiate.cu)" >&2
    status=1
  fi
done
count="$(wc -l <<<"$table")"
[ $status -eq 0 ] && echo "ok: $count kernels, no spills, no local memory"
exit $status
