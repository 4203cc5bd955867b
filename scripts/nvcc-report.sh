#!/usr/bin/env bash
# CMake's compiler launcher for the CUDA kernels: runs the nvcc command it is given and keeps
# ptxas's resource report (-Xptxas -v: registers, shared memory, stack, spills per kernel) in
# <object>.ptxas.txt, where scripts/check-ptxas.sh reads it. The build log shows only what is
# not that report (warnings, errors).
set -uo pipefail
object=""
previous=""
for arg in "$@"; do
  [ "$previous" = "-o" ] && object="$arg"
  previous="$arg"
done
log="$(mktemp)"
"$@" 2>"$log"
status=$?
grep -v -E '^ptxas info|^ +[0-9]+ bytes stack frame' "$log" >&2
if [ -n "$object" ]; then
  grep -E '^ptxas info|^ +[0-9]+ bytes stack frame' "$log" >"$object.ptxas.txt"
fi
rm -f "$log"
exit $status
