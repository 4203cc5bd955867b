#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test through ctest. Tests run one at a
# time: each is multi-threaded, and two at once on two cores would oversubscribe them.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/build.sh
cd build
ctest --output-on-failure "$@"
