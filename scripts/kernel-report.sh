#!/usr/bin/env bash
# The kernels' figures, after ./scripts/build.sh: each kernel's registers, static shared memory
# and spills from ptxas's sm_90 report, then the worst relative error of each kernel output per
# precision under the SIMT emulator (every thread order) against the CPU backend.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/check-ptxas.sh kernels build/CMakeFiles/ptrain_kernels.dir/kernels/instantiate.cu.o.ptxas.txt
errors="$(mktemp)"
trap 'rm -f "$errors"' EXIT
PTRAIN_KERNEL_ERRORS="$errors" ./build/tests/ptrain_kernel_tests "[kernels]" >/dev/null
echo
printf "%-44s %-6s %s\n" "output" "format" "worst relative error"
awk -F'\t' '{ k = $1 "\t" $2; if (!(k in worst) || $3 + 0 > worst[k]) worst[k] = $3 + 0 }
            END { for (k in worst) { split(k, p, "\t"); printf "%-44s %-6s %.2e\n", p[1], p[2], worst[k] } }' "$errors" | sort
echo
printf "%-6s %s\n" "format" "worst relative error over all kernels"
awk -F'\t' '{ if (!($2 in worst) || $3 + 0 > worst[$2]) worst[$2] = $3 + 0 }
            END { for (f in worst) printf "%-6s %.2e\n", f, worst[f] }' "$errors" | sort
