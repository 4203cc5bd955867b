#!/usr/bin/env bash
# Reads ptxas's -v reports (from scripts/nvcc-report.sh) and prints one line per kernel:
# registers, static shared memory, stack frame, spills, the most threads a block of it has and
# the registers such a block takes. Fails if any kernel spills or uses local memory (stack), if a
# kernel's registers for its largest block do not fit an SM's register file, if a report is
# empty, or if a __global__ kernel of kernels/*.cuh is missing from the reports (so a kernel that
# nvcc never compiled cannot pass unnoticed).
#
# Threads per block: ptxas's report does not give them, so they come from the sources. A kernel
# with __launch_bounds__(N) (N an integer or a `constexpr int` of KERNELS_DIR/*.cuh) has at most
# N; one without is assumed to have at most 256. The PTRAIN_LAUNCH calls of KERNELS_DIR/*.cuh
# (the only launches: src/ calls their launchers) hold the bounds and the assumption to account:
# a launch whose block size is a constant above its kernel's bound, or above 256 for a kernel
# without one, fails. A block size known only at run time cannot be checked here: under a bound
# the launch itself fails past it; without one it is printed as a note.
# Usage: check-ptxas.sh KERNELS_DIR REPORT...
set -euo pipefail
kernels_dir="$1"
shift
[ $# -gt 0 ] || { echo "check-ptxas: no report files given" >&2; exit 2; }
for report in "$@"; do
  [ -s "$report" ] || { echo "check-ptxas: $report is missing or empty (was the kernel object built?)" >&2; exit 1; }
done

# An SM's register file as one block may have it (sm_90, as every arch since sm_50): 64K 32-bit
# registers, at most 255 a thread, given to warps in units of 256.
sm_registers=65536
max_thread_registers=255
default_threads=256  # the threads per block a kernel without __launch_bounds__ is assumed to have

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

# Source text of KERNELS_DIR/*.cuh with the // comments dropped (they may hold parentheses).
sources() { sed 's://.*$::' "$kernels_dir"/*.cuh; }

# `constexpr int NAME = EXPR;` of the kernel headers, one value a name; "?" for a name given two.
declare -A constants=()
while read -r name value; do
  if [ -n "${constants[$name]+set}" ] && [ "${constants[$name]}" != "$value" ]; then
    constants[$name]="?"
  else
    constants[$name]="$value"
  fi
done < <(sources | grep -o -E 'constexpr int [A-Za-z_][A-Za-z0-9_]* = [^;,]+;' |
           sed -E 's/^constexpr int ([A-Za-z0-9_]+) = (.*);$/\1 \2/' || true)

# int_value EXPR: EXPR's value with the constants above in its names; fails on any other name.
int_value() {
  local expr="$1" name _
  for _ in 1 2 3 4 5 6 7 8; do  # constants defined by constants, a few deep
    [[ "$expr" =~ ^[^A-Za-z_]*([A-Za-z_][A-Za-z0-9_]*) ]] || break
    name="${BASH_REMATCH[1]}"
    [ -n "${constants[$name]+set}" ] && [ "${constants[$name]}" != "?" ] || return 1
    while [[ "$expr" =~ ^(.*[^A-Za-z0-9_]|)$name([^A-Za-z0-9_].*|)$ ]]; do
      expr="${BASH_REMATCH[1]}(${constants[$name]})${BASH_REMATCH[2]}"
    done
  done
  [[ "$expr" =~ ^[0-9\ ()+*/-]+$ ]] || return 1
  echo $((expr))
}

# Each __global__ declaration of the headers as NAME<TAB>BOUND, BOUND the first argument of its
# __launch_bounds__ or empty. A declaration runs from the last { } or ; to its body, so the bound
# may stand before __global__ (the kernels' spelling), after `void`, or on the line above.
declare -A bound=()
declared=()
while IFS=$'\t' read -r kernel expr; do
  declared+=("$kernel")
  [ -n "$expr" ] || continue
  if ! threads="$(int_value "$expr")" || [ "$threads" -lt 1 ] || [ "$threads" -gt 1024 ]; then
    echo "  FAIL: cannot work out __launch_bounds__($expr) of $kernel (want 1..1024: an integer or a constexpr int of $kernels_dir)" >&2
    status=1
    continue
  fi
  [ "${bound[$kernel]:-0}" -ge "$threads" ] || bound[$kernel]="$threads"
done < <(sources | tr '\n' ' ' | tr '{};' '\n' | awk '/__global__/ {
  expr = ""
  if (match($0, /__launch_bounds__ *\([^)]*\)/)) {
    expr = substr($0, RSTART, RLENGTH)
    sub(/^[^(]*\( */, "", expr); sub(/ *\)$/, "", expr); sub(/ *,.*/, "", expr)
    gsub(/__launch_bounds__ *\([^)]*\)/, "")
  }
  sub(/.*__global__/, ""); sub(/\(.*/, ""); sub(/.*[^A-Za-z0-9_]/, "")
  print $0 "\t" expr
}')

printf "%-72s %-6s %5s %6s %6s %7s %7s %8s\n" kernel arch regs smem stack spills threads regs/blk
while IFS=$'\t' read -r mangled arch regs smem stack spill_st spill_ld lmem; do
  name="$(echo "$mangled" | c++filt | sed -E 's/^void //; s/^ptrain::kernels:://; s/\(.*$//; s/__nv_bfloat16/bf16/g; s/__half/fp16/g')"
  # Registers a block of the most threads takes: each warp's rounded up to the unit of 256, and
  # the warps rounded up to the SM's 4 partitions, as the launch check counts them
  # (cudaOccMaxBlocksPerSMRegsLimit in cuda_occupancy.h). For 128-thread multiples that is
  # ceil(regs * 32 / 256) * 256 * threads / 32.
  threads="${bound[${name%%<*}]:-$default_threads}"
  warps=$(( ((threads + 31) / 32 + 3) / 4 * 4 ))
  block_regs=$(( (regs * 32 + 255) / 256 * 256 * warps ))
  printf "%-72s %-6s %5s %6s %6s %7s %7s %8s\n" "$name" "$arch" "$regs" "$smem" "$stack" "$((spill_st + spill_ld))" \
    "$threads" "$block_regs"
  if [ "$stack" -ne 0 ] || [ "$spill_st" -ne 0 ] || [ "$spill_ld" -ne 0 ] || [ "$lmem" -ne 0 ]; then
    echo "  FAIL: $name uses local memory (stack $stack, spill stores $spill_st, loads $spill_ld, lmem $lmem)" >&2
    status=1
  fi
  if [ "$regs" -gt $max_thread_registers ] || [ $block_regs -gt $sm_registers ]; then
    units=$(( sm_registers / 256 / warps ))  # whole units of 256 registers a warp, 8 a thread each
    fit=$(( units * 8 ))
    [ $fit -le $max_thread_registers ] || fit=$max_thread_registers
    echo "  FAIL: $name needs more registers than an SM has for a block of $threads threads: $regs a thread take $block_regs of $sm_registers (at most $fit a thread fit)" >&2
    status=1
  fi
done <<<"$table"

# Every __global__ function declared in the kernel headers must appear in the reports.
for kernel in $(printf '%s\n' "${declared[@]}" | sort -u); do
  if ! grep -q -E "[0-9]${kernel}(I|E)" <<<"$(cut -f1 <<<"$table")"; then
    echo "  FAIL: kernel $kernel is in $kernels_dir but not in any ptxas report (add its launcher to instantiate.cu)" >&2
    status=1
  fi
done

# Every PTRAIN_LAUNCH of the headers as FILE:LINE<TAB>KERNEL<TAB>BLOCK (its first and third
# arguments, split at the commas outside parentheses).
launches="$(awk '
  function emit(   i, c, depth, n, arg, args) {
    n = 0; depth = 0; arg = ""
    for (i = 1; i <= length(text); i++) {
      c = substr(text, i, 1)
      if (c == "(") depth++
      else if (c == ")") depth--
      if (c == "," && depth == 0) { args[++n] = arg; arg = ""; continue }
      arg = arg c
    }
    args[++n] = arg
    for (i = 1; i <= 3; i++) { gsub(/[ \t]+/, " ", args[i]); gsub(/^ | $/, "", args[i]) }
    print where "\t" args[1] "\t" args[3]
  }
  {
    line = $0
    sub(/\/\/.*/, "", line)
    if (!open) {
      if (line !~ /PTRAIN_LAUNCH\(/ || line ~ /#define/) next
      open = 1; depth = 1; text = ""; where = FILENAME ":" FNR
      sub(/.*\//, "", where)
      line = substr(line, index(line, "PTRAIN_LAUNCH(") + 14)
    }
    for (i = 1; i <= length(line); i++) {
      c = substr(line, i, 1)
      if (c == "(") depth++
      else if (c == ")" && --depth == 0) { emit(); open = 0; break }
      text = text c
    }
    text = text " "
  }' "$kernels_dir"/*.cuh)"

notes=""
while IFS=$'\t' read -r where launched block; do
  [ -n "$where" ] || continue
  kernel="${launched%%<*}"
  if [ -z "${declared[*]+set}" ] || ! printf '%s\n' "${declared[@]}" | grep -q -x -F "$kernel"; then
    # Launched through a variable: `auto convert_kernel_instance = convert_kernel<Dst, Src>;`
    kernel="$(grep -h -o -E "auto $kernel = [A-Za-z_][A-Za-z0-9_]*" "$kernels_dir/${where%%:*}" | head -n 1 |
              sed 's/.* //' || true)"
  fi
  if [ -z "$kernel" ]; then
    notes+="note: cannot tell which kernel PTRAIN_LAUNCH($launched, ...) at $where launches; its block is not checked"$'\n'
    continue
  fi
  limit="${bound[$kernel]:-}"
  if ! threads="$(int_value "$block")"; then
    [ -n "$limit" ] ||
      notes+="note: $kernel is launched with a block size known at run time ($block, $where); assumed at most $default_threads"$'\n'
    continue
  fi
  if [ -n "$limit" ] && [ "$threads" -gt "$limit" ]; then
    echo "  FAIL: $kernel is launched with $threads threads a block at $where, over its __launch_bounds__($limit)" >&2
    status=1
  elif [ -z "$limit" ] && [ "$threads" -gt $default_threads ]; then
    echo "  FAIL: $kernel is launched with $threads threads a block at $where but has no __launch_bounds__ (without one the check assumes $default_threads): give it __launch_bounds__($block)" >&2
    status=1
  fi
done <<<"$launches"
printf '%s' "$notes"

count="$(wc -l <<<"$table")"
[ $status -eq 0 ] && echo "ok: $count kernels, no spills, no local memory, registers fit their blocks"
exit $status
