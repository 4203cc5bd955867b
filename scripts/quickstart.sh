#!/usr/bin/env bash
# From a fresh Debian 12 machine to a trained model: installs what is missing, builds, and
# trains configs/quickstart.yaml (a ~1M-parameter byte-level GPT on a synthetic corpus whose
# loss floor is known) on the CPU. The run lands in runs/quickstart/.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
exec ./build/ptrain train configs/quickstart.yaml --set run.overwrite=true "$@"
