#!/usr/bin/env bash
# Builds here (no GPU needed; the toolkit compiles sm_90a) what scripts/gpu-check.sh runs on a
# borrowed GPU machine, which has CUDA 13, cuDNN and NCCL (as Python wheels) but none of
# ptrain's Debian packages and no network, and builds nothing itself:
#
#   .gpu-bundle/ptrain-gpu.tar.xz   bin/ptrain, bin/ptrain_gpu_tests (sm_90a, no -march=native:
#                                   the device's CPU is another), lib/ (the Debian libraries they
#                                   need that a bare CUDA image lacks), MANIFEST
#
# .gpu-bundle/ is git-ignored: name it in the device call's carry (the bundle and the repository
# together must stay under 64 MiB; this script fails above 48). Without MPI by default: the
# lent machines have one GPU. PTRAIN_GPU_BUNDLE_MPI=1 builds with MPI and adds
# bin/ptrain_multigpu_tests and Open MPI's libraries, for a machine of several GPUs with this
# machine's Open MPI installed (its mpirun, and the plugins libmpi loads from that install's
# paths); gpu-check.sh then runs ZeRO-0 to 3 across its GPUs. Never run so far: no lent machine
# has had two GPUs. Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
build=build-gpu-bundle
mpi=OFF targets=(ptrain ptrain_gpu_tests) mpi_text="no MPI"
if [ "${PTRAIN_GPU_BUNDLE_MPI:-0}" = 1 ]; then
  command -v mpirun >/dev/null || { echo "gpu-bundle: PTRAIN_GPU_BUNDLE_MPI=1 needs Open MPI here (mpirun not found)" >&2; exit 1; }
  mpi=ON targets+=(ptrain_multigpu_tests) mpi_text="with MPI ($(mpirun --version 2>/dev/null | head -1))"
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPTRAIN_CUDA=ON -DPTRAIN_MPI="$mpi" \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DPTRAIN_KERNEL_TESTS=OFF -DPTRAIN_NATIVE=OFF "$@" >/dev/null
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
cp "$build/ptrain" "$build/tests/ptrain_gpu_tests" "$stage/bin/"
[ "$mpi" = OFF ] || cp "$build/tests/ptrain_multigpu_tests" "$stage/bin/"
strip --strip-unneeded "$stage/bin/"*

# Every shared library the binaries load, except the C/C++ runtime any Linux image has and the
# CUDA libraries the device provides (its versions are the point of the check).
provided='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libcudnn|libnccl|libnvrtc|libnvJitLink)\.so'
for bin in "$stage/bin/"*; do
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }'
done | sort -u | while read -r soname path; do
  [[ "$soname" =~ $provided ]] && continue
  cp -L "$path" "$stage/lib/$soname"
done
missing="$(for bin in "$stage/bin/"*; do ldd "$bin" | grep 'not found' || true; done)"
[ -z "$missing" ] || { echo "gpu-bundle: unresolved libraries here: $missing" >&2; exit 1; }

{
  echo "ptrain GPU bundle"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), CUDA architectures 90a, $mpi_text"
  echo "libraries carried:"; (cd "$stage/lib" && ls -1 | sed 's/^/  /')
  echo "libraries the device must provide:"
  # cuBLASLt is not linked but loaded on first use (cublaslt_on_demand.cpp).
  { for bin in "$stage/bin/"*; do ldd "$bin"; done | awk '{ print $1 }' | grep -E "$provided" | grep -E 'libcu|libnccl|libnv'
    grep -aoE -m1 'libcublasLt\.so\.[0-9]+' "$stage/bin/ptrain" ||
      { echo "gpu-bundle: bin/ptrain names no libcublasLt.so.N to load" >&2; exit 1; }
  } | sort -u | sed 's/^/  /'
} >"$stage/MANIFEST"

mkdir -p .gpu-bundle
tar -C "$stage" -cJf .gpu-bundle/ptrain-gpu.tar.xz .
bytes=$(stat -c %s .gpu-bundle/ptrain-gpu.tar.xz)
tree=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{ s += $1 } END { print s + 0 }')
cat "$stage/MANIFEST"
awk -v b="$bytes" -v t="$tree" 'BEGIN { m = 1048576; printf "bundle: .gpu-bundle/ptrain-gpu.tar.xz, %.1f MiB; with the tracked tree (%.1f MiB): %.1f MiB of the 64 MiB a device call carries\n", b / m, t / m, (b + t) / m }'
[ $((bytes + tree)) -lt $((48 << 20)) ] || { echo "gpu-bundle: over 48 MiB: too close to the 64 MiB limit" >&2; exit 1; }
