# shellcheck shell=bash
# Functions scripts/gpu-check.sh shares with the tests that check it without a GPU
# (tests/test_gpu_scripts.cpp). Sourced by bash, never run.

# catch_filter NAME: the Catch2 (v2.13) test spec that selects the test named NAME and no other.
# A spec is split at commas, and [ ] " ~ and \ start tags, quotes, exclusions and escapes;
# a backslash makes the character after it plain (TestSpecParser::visitChar). A `*` at either
# end of a name would stay a wildcard even escaped; no test name has one.
catch_filter() {
  printf '%s\n' "$1" | sed 's/[][\\,"~*]/\\&/g'
}

# kernels_defined DIR: the name of every __global__ function in DIR/*.cuh, sorted.
kernels_defined() {
  sed -n 's/.*__global__ void \([A-Za-z_][A-Za-z0-9_]*\).*/\1/p' "$1"/*.cuh | sort -u
}

# kernels_named LOG...: the kernels that PTRAIN_KERNEL_LOG files name, as kernels/ defines them,
# sorted. A log holds each launch's first argument as written (kernels/common.cuh): a kernel
# template with its arguments (`gelu_forward_kernel<T>`), or, where the arguments hold a comma
# that would split the macro's, the variable it was launched through, named after it
# (`auto convert_kernel_instance = convert_kernel<Dst, Src>`). A missing log names none.
kernels_named() {
  cat "$@" 2>/dev/null | sed 's/<.*//; s/_instance$//' | sort -u
}

# kernels_not_reached DIR LOG...: the kernels of DIR/*.cuh that no LOG names.
kernels_not_reached() {
  local dir="$1"
  shift
  comm -23 <(kernels_defined "$dir") <(kernels_named "$@")
}

# py ARGS...: python3 with the library path from before scripts/gpu-check.sh put the bundle's
# libraries first (PTRAIN_ORIGINAL_LD_LIBRARY_PATH), so that PyTorch loads its own, not the
# bundle's libstdc++, libgomp or OpenBLAS; run alone, with the path as it is.
py() { LD_LIBRARY_PATH="${PTRAIN_ORIGINAL_LD_LIBRARY_PATH-${LD_LIBRARY_PATH-}}" python3 "$@"; }
