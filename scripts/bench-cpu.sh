#!/usr/bin/env bash
# CPU benchmark: builds, then trains configs/bench-cpu.yaml for 20 steps and prints median
# ms/step, tokens/s and model FLOP/s over steps 2-20 beside the machine's sgemm ceiling
# (measured in the same run, same BLAS, same thread count). Extra arguments go to ptrain,
# e.g. --set training.threads=1.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
exec ./build/ptrain bench configs/bench-cpu.yaml "$@"
