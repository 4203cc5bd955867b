// FP8 casts and scaling factors: the per-tensor cast (optionally writing, in the same pass, the
// transpose that the weight-gradient GEMM reads), the transpose of codes already cast, amax for
// current scaling, 1x128 / 128x128 block quantisation. (Delayed scaling's state is updated on
// the host, from the amaxes the casts record: model/fp8_linear.h.)
//
// Why this shape: codes come from float_to_fp8, the same NVIDIA conversion the CPU backend's
// emulation calls, and scales repeat ptrain::current_scale / scale_from_amax operation for
// operation, so every result here is bit-identical to the reference. Each cast also records its
// telemetry (amax, non-zero, underflow and saturated counts, with the CPU's definitions). These
// are combined with integer atomics, which commute, so the totals do not depend on timing: amax
// through atomicMax on the bits of |x| (non-negative floats order like their bit patterns, and
// every NaN is recorded as 0x7FC00000, above infinity, so a NaN anywhere gives a NaN amax). To
// keep the atomics few, grids are capped and stride over the tensor, and each block reduces its
// share first and issues one atomic per quantity.
#pragma once

#include <cfloat>

#include "common.cuh"

namespace ptrain::kernels {

// What the casts of one tensor did, in device memory; the caller zeroes it (and the amax).
struct Fp8Counts {
  unsigned long long nonzero;    // non-zero inputs
  unsigned long long underflow;  // non-zero inputs whose code decodes to zero
  unsigned long long saturated;  // inputs whose scaled value was clipped to the format's max
};

// Where each block's dequantisation factor goes in a scale_inv array: block (i, j) (the i-th
// block row, the j-th block column of the tensor) at i * row_stride + j * col_stride. Row-major
// is {number of block columns, 1}; cuBLASLt's block-scaled GEMMs want their own layouts
// (src/backend/cuda/matmul.h, gemm_scale_floats).
struct BlockScaleLayout {
  int row_stride = 0, col_stride = 1;
};

// What a block quantisation writes: the (rows, cols) codes and/or their (cols, rows) transpose,
// each with its factors in its own layout. A null pointer skips that output; the transpose's
// factors may be written without its codes.
struct Fp8BlockCodes {
  fp8* codes = nullptr;
  float* scale_inv = nullptr;
  BlockScaleLayout layout;
  fp8* codes_t = nullptr;
  float* scale_inv_t = nullptr;
  BlockScaleLayout layout_t;
};

constexpr int kFp8Threads = 256;
constexpr int kFp8MaxBlocks = 1024;  // about one wave on an H100/H200; grids stride beyond it
constexpr int kFp8Tile = 64;         // transposing cast: 64 x 64 tiles
constexpr int kFp8TilePitch = kFp8Tile + 4;  // bytes per parked tile row
constexpr int kFp8TallyWords = 4 * kWarpSize;
constexpr unsigned kCanonicalNanBits = 0x7FC00000u;

// ---------------------------------------------------------------------------- device helpers

// Bits of |x|, with every NaN as the canonical quiet NaN (what the CPU's amax returns).
__device__ __forceinline__ unsigned abs_bits(float x) {
  return is_nan(x) ? kCanonicalNanBits : (__float_as_uint(x) & 0x7FFFFFFFu);
}

// ptrain::current_scale: fp8_max / amax, 1 for an amax that is 0 or not finite, never infinite.
__device__ __forceinline__ float fp8_current_scale(float amax, float max_value) {
  if (!(is_finite(amax) && amax > 0.0f)) return 1.0f;
  const float scale = max_value / amax;
  return is_finite(scale) ? scale : FLT_MAX;
}

// V codes stored with one 4- or 8-byte write.
template <int V>
struct alignas(V) Fp8Vec {
  fp8 v[V];
};

// Writes codes [0, count) at p: one store when the chunk is whole and aligned, else byte by byte.
template <int V>
__device__ __forceinline__ void store_codes(fp8* p, const Fp8Vec<V>& codes, int count) {
  if (count == V && reinterpret_cast<uintptr_t>(p) % V == 0) {
#ifdef __CUDACC__
    *reinterpret_cast<Fp8Vec<V>*>(p) = codes;
#else
    std::memcpy(p, &codes, V);
#endif
  } else {
    for (int k = 0; k < count; ++k) p[k] = codes.v[k];
  }
}

// Reads codes [0, count) at p (the rest 0): one load when the chunk is whole and aligned.
template <int V>
__device__ __forceinline__ Fp8Vec<V> load_codes(const fp8* p, int count) {
  Fp8Vec<V> codes{};
  if (count == V && reinterpret_cast<uintptr_t>(p) % V == 0) {
#ifdef __CUDACC__
    codes = *reinterpret_cast<const Fp8Vec<V>*>(p);
#else
    std::memcpy(&codes, p, V);
#endif
  } else {
    for (int k = 0; k < count; ++k) codes.v[k] = p[k];
  }
  return codes;
}

// Writes the parked kFp8Tile x kFp8Tile tile at (r0, c0) of a (rows, cols) tensor into its
// (cols, rows) transpose: each thread gathers 8 codes of a tile column and writes them as one
// 8-byte store of a transpose row. The caller's barrier must precede it and follow it.
__device__ __forceinline__ void store_tile_transposed(const fp8* tile, fp8* out_t, int r0, int c0, int rows, int cols) {
  constexpr int kOut = 8, kWriteChunks = kFp8Tile / kOut;
  for (int idx = threadIdx.x; idx < kFp8Tile * kWriteChunks; idx += blockDim.x) {
    const int cj = idx / kWriteChunks, rr = (idx % kWriteChunks) * kOut;  // tile column, first tile row
    const int c = c0 + cj, r = r0 + rr;
    if (c >= cols || r >= rows) continue;
    const int count = rows - r < kOut ? rows - r : kOut;
    Fp8Vec<kOut> codes{};
    for (int k = 0; k < count; ++k) codes.v[k] = tile[(rr + k) * kFp8TilePitch + cj];
    store_codes(out_t + static_cast<size_t>(c) * rows + r, codes, count);
  }
}

// One thread's share of a cast's telemetry, and the cast itself.
struct Fp8Tally {
  unsigned amax_bits = 0, nonzero = 0, underflow = 0, saturated = 0;

  // The code of x * scale (saturating), counted with the CPU backend's definitions
  // (cpu_backend.cpp, fp8_cast_run).
  __device__ __forceinline__ fp8 cast(float x, float scale, __nv_fp8_interpretation_t format) {
    const unsigned a = abs_bits(x);
    amax_bits = a > amax_bits ? a : amax_bits;
    const float y = x * scale;
    const fp8 code = float_to_fp8(y, format);
    if (x != 0.0f) {
      ++nonzero;
      if (fp8_to_float(code, format) == 0.0f) ++underflow;
    }
    // Clipped: beyond max, and beyond what round-to-nearest would still bring back to max.
    if (fabsf(y) > fp8_max(format) && !is_finite(fp8_to_float(__nv_cvt_float_to_fp8(y, __NV_NOSAT, format), format)))
      ++saturated;
    return code;
  }

  // Adds the block's tallies to the tensor's amax and counts: warp reductions, then thread 0
  // combines the warps and issues one atomic per quantity. Every thread of the block must call
  // it; `scratch` is kFp8TallyWords words of shared memory.
  __device__ __forceinline__ void commit(unsigned* scratch, float* amax, Fp8Counts* counts) const {
    const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
    const unsigned a = warp_reduce(amax_bits, UnsignedMax{}), nz = warp_reduce(nonzero, Sum{}), uf = warp_reduce(underflow, Sum{}),
                   sat = warp_reduce(saturated, Sum{});
    if (lane == 0) {
      scratch[warp] = a;
      scratch[kWarpSize + warp] = nz;
      scratch[2 * kWarpSize + warp] = uf;
      scratch[3 * kWarpSize + warp] = sat;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      const int warps = blockDim.x / kWarpSize;
      unsigned block_amax = 0;
      unsigned long long block_nz = 0, block_uf = 0, block_sat = 0;
      for (int w = 0; w < warps; ++w) {
        block_amax = scratch[w] > block_amax ? scratch[w] : block_amax;
        block_nz += scratch[kWarpSize + w];
        block_uf += scratch[2 * kWarpSize + w];
        block_sat += scratch[3 * kWarpSize + w];
      }
      atomicMax(reinterpret_cast<unsigned*>(amax), block_amax);
      if (block_nz) atomicAdd(&counts->nonzero, block_nz);
      if (block_uf) atomicAdd(&counts->underflow, block_uf);
      if (block_sat) atomicAdd(&counts->saturated, block_sat);
    }
  }
};

// ---------------------------------------------------------------------------- kernels

// Flat cast: each thread casts chunks of 16 / sizeof(T) elements, grid-stride.
template <typename T>
__global__ void fp8_cast_kernel(fp8* out, float* amax, Fp8Counts* counts, const T* in, size_t n, const float* scale,
                                __nv_fp8_interpretation_t format) {
  PTRAIN_DYNAMIC_SHARED(unsigned, scratch);  // kFp8TallyWords
  constexpr int V = Packed128<T>::size;
  const float s = *scale;
  const size_t chunks = ceil_div(n, static_cast<size_t>(V));
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  Fp8Tally tally;
  for (size_t c = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks; c += stride) {
    const size_t base = c * V;
    const int count = run_len(n, base, V);
    float x[V];
    load_chunk(x, in + base, 0, count);
    Fp8Vec<V> codes{};
    for (int k = 0; k < count; ++k) codes.v[k] = tally.cast(x[k], s, format);
    store_codes(out + base, codes, count);
  }
  tally.commit(scratch, amax, counts);
}

// Cast writing both (rows, cols) codes and their (cols, rows) transpose. A block takes 64 x 64
// tiles in turn. Each thread reads 16-byte chunks of the tile's rows (coalesced), writes their
// codes (one 4- or 8-byte store) and parks them in shared memory; after a barrier the tile goes
// out transposed (store_tile_transposed). Rows of the parked tile are padded to kFp8TilePitch
// bytes to spread the column reads over banks.
template <typename T>
__global__ void fp8_cast_transpose_kernel(fp8* out, fp8* out_t, float* amax, Fp8Counts* counts, const T* in, int rows,
                                          int cols, const float* scale, __nv_fp8_interpretation_t format) {
  PTRAIN_DYNAMIC_SHARED(unsigned, shared);
  unsigned* scratch = shared;                                         // kFp8TallyWords
  fp8* tile = reinterpret_cast<fp8*>(shared + kFp8TallyWords);        // kFp8Tile x kFp8TilePitch codes
  constexpr int V = Packed128<T>::size;                               // elements read per thread
  constexpr int kReadChunks = kFp8Tile / V;
  const int tile_cols = ceil_div(cols, kFp8Tile);
  const int tiles = ceil_div(rows, kFp8Tile) * tile_cols;
  const float s = *scale;
  Fp8Tally tally;
  for (int t = blockIdx.x; t < tiles; t += static_cast<int>(gridDim.x)) {  // uniform over the block
    const int r0 = (t / tile_cols) * kFp8Tile, c0 = (t % tile_cols) * kFp8Tile;
    for (int idx = threadIdx.x; idx < kFp8Tile * kReadChunks; idx += blockDim.x) {
      const int j = idx / kReadChunks, cc = (idx % kReadChunks) * V;  // tile row, first tile column
      const int r = r0 + j, c = c0 + cc;
      if (r >= rows || c >= cols) continue;
      const int count = cols - c < V ? cols - c : V;
      float x[V];
      load_chunk(x, in + static_cast<size_t>(r) * cols, c, cols);
      Fp8Vec<V> codes{};
      for (int k = 0; k < count; ++k) {
        codes.v[k] = tally.cast(x[k], s, format);
        tile[j * kFp8TilePitch + cc + k] = codes.v[k];
      }
      store_codes(out + static_cast<size_t>(r) * cols + c, codes, count);
    }
    __syncthreads();
    store_tile_transposed(tile, out_t, r0, c0, rows, cols);
    __syncthreads();  // the next tile overwrites this one
  }
  tally.commit(scratch, amax, counts);
}

// The (cols, rows) transpose of (rows, cols) codes, byte for byte: the weight's transpose for
// the dgrad GEMM, made from its codes when the GEMM runs rather than kept beside them. A block
// takes 64 x 64 tiles in turn, reading tile rows 16 codes at a time (coalesced) into shared
// memory, then writing them out transposed.
template <int = 0>
__global__ void fp8_transpose_kernel(fp8* out_t, const fp8* in, int rows, int cols) {
  PTRAIN_DYNAMIC_SHARED(unsigned, shared);
  fp8* tile = reinterpret_cast<fp8*>(shared);  // kFp8Tile x kFp8TilePitch codes
  constexpr int kIn = 16, kReadChunks = kFp8Tile / kIn;
  const int tile_cols = ceil_div(cols, kFp8Tile);
  const int tiles = ceil_div(rows, kFp8Tile) * tile_cols;
  for (int t = blockIdx.x; t < tiles; t += static_cast<int>(gridDim.x)) {  // uniform over the block
    const int r0 = (t / tile_cols) * kFp8Tile, c0 = (t % tile_cols) * kFp8Tile;
    for (int idx = threadIdx.x; idx < kFp8Tile * kReadChunks; idx += blockDim.x) {
      const int j = idx / kReadChunks, cc = (idx % kReadChunks) * kIn;  // tile row, first tile column
      const int r = r0 + j, c = c0 + cc;
      if (r >= rows || c >= cols) continue;
      const int count = cols - c < kIn ? cols - c : kIn;
      const Fp8Vec<kIn> codes = load_codes<kIn>(in + static_cast<size_t>(r) * cols + c, count);
      for (int k = 0; k < count; ++k) tile[j * kFp8TilePitch + cc + k] = codes.v[k];
    }
    __syncthreads();
    store_tile_transposed(tile, out_t, r0, c0, rows, cols);
    __syncthreads();  // the next tile overwrites this one
  }
}

// *amax = max(*amax, max |x|), NaN if any x is NaN.
template <typename T>
__global__ void amax_kernel(float* amax, const T* in, size_t n) {
  PTRAIN_DYNAMIC_SHARED(unsigned, scratch);  // 32 words
  constexpr int V = Packed128<T>::size;
  const size_t chunks = ceil_div(n, static_cast<size_t>(V));
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  unsigned bits = 0;
  for (size_t c = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks; c += stride) {
    float x[V];
    load_chunk(x, in + c * V, 0, run_len(n, c * V, V));
    for (int k = 0; k < V; ++k) {  // missing elements read as 0
      const unsigned a = abs_bits(x[k]);
      bits = a > bits ? a : bits;
    }
  }
  bits = block_reduce(bits, scratch, 0u, UnsignedMax{});
  if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned*>(amax), bits);
}

// A template only so that several translation units may include this header: a template kernel
// is emitted once per program, a plain one would be defined in each.
template <int = 0>
__global__ void current_scale_kernel(float* scale, float* scale_inv, const float* amax, float max_value) {
  if (threadIdx.x == 0) {
    const float s = fp8_current_scale(*amax, max_value);
    *scale = s;
    *scale_inv = 1.0f / s;
  }
}

// Block quantisation. A tile of block_rows x block_cols is handled by one warp (kWarpPerTile,
// for 1 x block_cols tiles: a block takes 8 tiles at once) or by the whole block (its warps take
// the tile's rows in turn). Two passes over the tile: its amax, then the cast with its scale
// (the second read mostly hits cache).
template <typename T, bool kWarpPerTile>
__global__ void fp8_quantize_blocks_kernel(Fp8BlockCodes dst, float* amax, Fp8Counts* counts, const T* in, int rows,
                                           int cols, int block_rows, int block_cols,
                                           __nv_fp8_interpretation_t format) {
  PTRAIN_DYNAMIC_SHARED(unsigned, scratch);  // kFp8TallyWords (its first 32 also serve block_reduce)
  constexpr int V = Packed128<T>::size;
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  const int tiles_per_block = kWarpPerTile ? warps : 1;
  const int row_step = kWarpPerTile ? 1 : warps;
  const int row_offset = kWarpPerTile ? 0 : warp;
  const int tile_cols = ceil_div(cols, block_cols);
  const int tiles = ceil_div(rows, block_rows) * tile_cols;
  const float max_value = fp8_max(format);
  Fp8Tally tally;
  // Whole-block tiles: t is the same for every thread, so every thread meets every barrier.
  for (int t = static_cast<int>(blockIdx.x) * tiles_per_block + (kWarpPerTile ? warp : 0); t < tiles;
       t += static_cast<int>(gridDim.x) * tiles_per_block) {
    const int r0 = (t / tile_cols) * block_rows, c0 = (t % tile_cols) * block_cols;
    const int r1 = rows - r0 < block_rows ? rows : r0 + block_rows;
    const int width = cols - c0 < block_cols ? cols - c0 : block_cols;
    // The tile's amax. fmaxf skips NaN, as the CPU's std::max(amax, |x|) does; the result is a
    // non-negative number, so its bits order like its value.
    float m = 0.0f;
    for (int r = r0 + row_offset; r < r1; r += row_step) {
      const T* row = in + static_cast<size_t>(r) * cols + c0;
      for (int i = lane * V; i < width; i += kWarpSize * V) {
        float x[V];
        load_chunk(x, row, i, width);
        for (int k = 0; k < V; ++k) m = fmaxf(m, fabsf(x[k]));  // missing elements read as 0
      }
    }
    const unsigned bits = kWarpPerTile ? warp_reduce(__float_as_uint(m), UnsignedMax{})
                                        : block_reduce(__float_as_uint(m), scratch, 0u, UnsignedMax{});
    const float scale = fp8_current_scale(__uint_as_float(bits), max_value);
    for (int r = r0 + row_offset; r < r1; r += row_step) {
      const size_t row = static_cast<size_t>(r) * cols + c0;
      for (int i = lane * V; i < width; i += kWarpSize * V) {
        float x[V];
        load_chunk(x, in + row, i, width);
        const int count = width - i < V ? width - i : V;
        Fp8Vec<V> codes{};
        for (int k = 0; k < count; ++k) codes.v[k] = tally.cast(x[k], scale, format);
        if (dst.codes) store_codes(dst.codes + row + i, codes, count);
        if (dst.codes_t)  // byte by byte down a transposed column
          for (int k = 0; k < count; ++k) dst.codes_t[static_cast<size_t>(c0 + i + k) * rows + r] = codes.v[k];
      }
    }
    if (lane == 0 && row_offset == 0) {
      const int i = t / tile_cols, j = t % tile_cols;
      if (dst.scale_inv) dst.scale_inv[i * dst.layout.row_stride + j * dst.layout.col_stride] = 1.0f / scale;
      if (dst.scale_inv_t) dst.scale_inv_t[i * dst.layout_t.row_stride + j * dst.layout_t.col_stride] = 1.0f / scale;
    }
  }
  tally.commit(scratch, amax, counts);
}

// Column tiles (block_rows x 1) written transposed: the operands of the weight-gradient GEMM,
// which contracts over tokens (cuBLASLt reads them as (cols, rows) with 1 x block_rows tiles).
// A warp takes 32 neighbouring columns of one block row: each lane reads its column down the
// block's rows (a warp's reads are 32 neighbouring elements of a row), takes the column's amax,
// then casts it, parking 16 codes at a time for one 16-byte store along its transposed row.
template <typename T>
__global__ void fp8_quantize_columns_transposed_kernel(fp8* out_t, float* scale_inv, BlockScaleLayout layout,
                                                       float* amax, Fp8Counts* counts, const T* in, int rows,
                                                       int cols, int block_rows, __nv_fp8_interpretation_t format) {
  PTRAIN_DYNAMIC_SHARED(unsigned, scratch);  // kFp8TallyWords
  constexpr int kRun = 16;                   // codes per store
  const int lane = threadIdx.x % kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  const int strips_per_row = ceil_div(cols, kWarpSize);
  const int strips = ceil_div(rows, block_rows) * strips_per_row;
  const float max_value = fp8_max(format);
  Fp8Tally tally;
  for (int strip = static_cast<int>(blockIdx.x) * warps + static_cast<int>(threadIdx.x) / kWarpSize; strip < strips;
       strip += static_cast<int>(gridDim.x) * warps) {
    const int i = strip / strips_per_row, r0 = i * block_rows;
    const int c = (strip % strips_per_row) * kWarpSize + lane;
    if (c >= cols) continue;  // no barrier below: lanes may leave
    const int r1 = rows - r0 < block_rows ? rows : r0 + block_rows;
    float m = 0.0f;  // fmaxf skips NaN, as the CPU's std::max(amax, |x|) does
    for (int r = r0; r < r1; ++r) m = fmaxf(m, fabsf(to_float(in[static_cast<size_t>(r) * cols + c])));
    const float scale = fp8_current_scale(m, max_value);
    for (int r = r0; r < r1; r += kRun) {
      const int count = r1 - r < kRun ? r1 - r : kRun;
      Fp8Vec<kRun> codes{};
      for (int k = 0; k < count; ++k) codes.v[k] = tally.cast(to_float(in[static_cast<size_t>(r + k) * cols + c]), scale, format);
      store_codes(out_t + static_cast<size_t>(c) * rows + r, codes, count);
    }
    scale_inv[i * layout.row_stride + c * layout.col_stride] = 1.0f / scale;
  }
  tally.commit(scratch, amax, counts);
}

template <int = 0>
__global__ void fixed_scale_kernel(float* scale, float* scale_inv, float value) {
  if (threadIdx.x == 0) {
    *scale = value;
    *scale_inv = 1.0f / value;
  }
}

// A part of a weight cast on several ranks (primary FP8 weights under ZeRO): element i of `in` is
// element first + i of a (., cols) row-major tensor, its block (r / block_rows, c / block_cols)
// numbered row-major over ceil(cols / block_cols) block columns.
__device__ __forceinline__ int64_t part_block(int64_t at, int64_t cols, int block_rows, int block_cols) {
  const int64_t tile_cols = (cols + block_cols - 1) / block_cols;
  return at / cols / block_rows * tile_cols + at % cols / block_cols;
}

// amaxes[b - base] = max(itself, |x|) over the part's elements of each block b (NaN skipped, as
// the block cast's fmaxf skips it). Each thread takes a run of kFp8PartRun elements and issues
// one atomicMax per block the run meets (bits order like values: the maxima are never negative).
constexpr int kFp8PartRun = 64;
template <typename T>
__global__ void fp8_block_amax_part_kernel(float* amaxes, int64_t base, const T* in, size_t n, int64_t first,
                                           int64_t cols, int block_rows, int block_cols) {
  const size_t runs = ceil_div(n, static_cast<size_t>(kFp8PartRun));
  for (size_t r = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < runs;
       r += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t end = (r + 1) * kFp8PartRun < n ? (r + 1) * kFp8PartRun : n;
    int64_t block = -1;
    float m = 0.0f;
    for (size_t i = r * kFp8PartRun; i < end; ++i) {
      const int64_t b = part_block(first + static_cast<int64_t>(i), cols, block_rows, block_cols);
      if (b != block) {
        if (block >= 0) atomicMax(reinterpret_cast<unsigned*>(amaxes + (block - base)), __float_as_uint(m));
        block = b;
        m = 0.0f;
      }
      m = fmaxf(m, fabsf(to_float(in[i])));
    }
    if (block >= 0) atomicMax(reinterpret_cast<unsigned*>(amaxes + (block - base)), __float_as_uint(m));
  }
}

// The part cast with scales[0] (scale_count 1) or its block's scale: its codes, or (codes null)
// their dequantised values, code * (1 / scale) as fp8_dequantize writes them. Tallies as fp8_cast.
template <typename T>
__global__ void fp8_encode_part_kernel(fp8* codes, float* values, float* amax, Fp8Counts* counts, const T* in, size_t n,
                                       int64_t first, int64_t cols, const float* scales, int scale_count,
                                       int block_rows, int block_cols, __nv_fp8_interpretation_t format) {
  PTRAIN_DYNAMIC_SHARED(unsigned, scratch);  // kFp8TallyWords
  Fp8Tally tally;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float scale =
        scale_count == 1 ? scales[0] : scales[part_block(first + static_cast<int64_t>(i), cols, block_rows, block_cols)];
    const fp8 code = tally.cast(to_float(in[i]), scale, format);
    if (codes)
      codes[i] = code;
    else
      values[i] = fp8_to_float(code, format) * (1.0f / scale);
  }
  tally.commit(scratch, amax, counts);
}

// ---------------------------------------------------------------------------- launchers

// Blocks for `items` work items of `per_block` each, capped at max_blocks (grids stride beyond).
inline int fp8_grid(size_t items, int per_block, int max_blocks) {
  if (max_blocks < 1) throw std::invalid_argument("fp8 kernels: max_blocks must be at least 1");
  const size_t blocks = ceil_div(items, static_cast<size_t>(per_block));
  return blocks < static_cast<size_t>(max_blocks) ? static_cast<int>(blocks) : max_blocks;
}

// out = fp8 codes of in * (*scale), saturating, for `in` (rows, cols) row-major; if
// out_transposed is not null it also receives the (cols, rows) codes, in the same pass. *amax
// and *counts accumulate (max, +) over the tensor: zero them first (or keep accumulating over a
// step's casts). `scale` is a device pointer, so scales computed on the device need no copy
// back. max_blocks caps the grid (tests lower it to exercise the grid-stride loops).
template <typename T>
void fp8_cast(fp8* out, fp8* out_transposed, float* amax, Fp8Counts* counts, const T* in, int rows, int cols,
              const float* scale, __nv_fp8_interpretation_t format, cudaStream_t stream,
              int max_blocks = kFp8MaxBlocks) {
  if (rows <= 0 || cols <= 0) return;
  if (!out_transposed) {
    const size_t n = static_cast<size_t>(rows) * static_cast<size_t>(cols);
    const int blocks = fp8_grid(ceil_div(n, static_cast<size_t>(Packed128<T>::size)), kFp8Threads, max_blocks);
    PTRAIN_LAUNCH(fp8_cast_kernel<T>, blocks, kFp8Threads, kFp8TallyWords * sizeof(unsigned), stream, out, amax, counts,
                  in, n, scale, format);
    return;
  }
  const size_t tiles = static_cast<size_t>(ceil_div(rows, kFp8Tile)) * static_cast<size_t>(ceil_div(cols, kFp8Tile));
  const size_t shared = kFp8TallyWords * sizeof(unsigned) + kFp8Tile * kFp8TilePitch;
  PTRAIN_LAUNCH(fp8_cast_transpose_kernel<T>, fp8_grid(tiles, 1, max_blocks), kFp8Threads, shared, stream, out,
                out_transposed, amax, counts, in, rows, cols, scale, format);
}

// out_t (cols, rows) = the transpose of the (rows, cols) codes `in`; the two must not overlap.
inline void fp8_transpose(fp8* out_t, const fp8* in, int rows, int cols, cudaStream_t stream,
                          int max_blocks = kFp8MaxBlocks) {
  if (rows <= 0 || cols <= 0) return;
  const size_t tiles = static_cast<size_t>(ceil_div(rows, kFp8Tile)) * static_cast<size_t>(ceil_div(cols, kFp8Tile));
  PTRAIN_LAUNCH(fp8_transpose_kernel<0>, fp8_grid(tiles, 1, max_blocks), kFp8Threads, kFp8Tile * kFp8TilePitch, stream,
                out_t, in, rows, cols);
}

// *amax = max(*amax, max |in|) over n elements (NaN if any is NaN): the first read of current
// scaling. Zero *amax first.
template <typename T>
void amax(float* amax, const T* in, size_t n, cudaStream_t stream, int max_blocks = kFp8MaxBlocks) {
  if (n == 0) return;
  const int blocks = fp8_grid(ceil_div(n, static_cast<size_t>(Packed128<T>::size)), kFp8Threads, max_blocks);
  PTRAIN_LAUNCH(amax_kernel<T>, blocks, kFp8Threads, kWarpSize * sizeof(unsigned), stream, amax, in, n);
}

// Current scaling: *scale = ptrain::current_scale(*amax, max_value), *scale_inv = 1 / *scale,
// on the device (no synchronisation between the amax and the cast).
inline void current_scale_from_amax(float* scale, float* scale_inv, const float* amax, float max_value,
                                    cudaStream_t stream) {
  PTRAIN_LAUNCH(current_scale_kernel<0>, 1, kWarpSize, 0, stream, scale, scale_inv, amax, max_value);
}

// *scale = value, *scale_inv = 1 / value, in stream order: a scale the host chose (delayed
// scaling) reaches the device as a kernel argument, without a copy from pageable memory (which
// may synchronise the stream).
inline void set_scale(float* scale, float* scale_inv, float value, cudaStream_t stream) {
  PTRAIN_LAUNCH(fixed_scale_kernel<0>, 1, kWarpSize, 0, stream, scale, scale_inv, value);
}

// Block scaling of `in` (rows, cols): each block_rows x block_cols block (1 x 128 tiles,
// 128 x 128 blocks, 128 x 1 tiles; ragged at the edges) gets scale = ptrain::current_scale(amax
// of the block), its codes of x * scale, and 1 / scale as its factor, written where `dst` says.
// Column tiles (block_cols 1) with only a transposed output take a kernel of their own. *amax
// and *counts accumulate over the whole tensor as in fp8_cast.
template <typename T>
void fp8_quantize_blocks_into(const Fp8BlockCodes& dst, float* amax, Fp8Counts* counts, const T* in, int rows, int cols,
                         int block_rows, int block_cols, __nv_fp8_interpretation_t format, cudaStream_t stream,
                         int max_blocks = kFp8MaxBlocks) {
  if (block_rows < 1 || block_cols < 1) throw std::invalid_argument("fp8_quantize_blocks: block shape must be positive");
  // The transpose's factors may come without its codes: those are made later from the codes
  // (fp8_transpose), as the weight's are.
  if ((!dst.codes && !dst.codes_t) || (!dst.codes != !dst.scale_inv) || (dst.codes_t && !dst.scale_inv_t))
    throw std::invalid_argument("fp8_quantize_blocks_into: each output needs both its codes and its factors");
  if (rows <= 0 || cols <= 0) return;
  const size_t shared = kFp8TallyWords * sizeof(unsigned);
  if (block_cols == 1 && !dst.codes) {
    const size_t strips = static_cast<size_t>(ceil_div(rows, block_rows)) * static_cast<size_t>(ceil_div(cols, kWarpSize));
    PTRAIN_LAUNCH(fp8_quantize_columns_transposed_kernel<T>, fp8_grid(strips, kFp8Threads / kWarpSize, max_blocks),
                  kFp8Threads, shared, stream, dst.codes_t, dst.scale_inv_t, dst.layout_t, amax, counts, in, rows,
                  cols, block_rows, format);
    return;
  }
  const size_t tiles = static_cast<size_t>(ceil_div(rows, block_rows)) * static_cast<size_t>(ceil_div(cols, block_cols));
  if (block_rows == 1) {
    auto fp8_quantize_blocks_kernel_instance = fp8_quantize_blocks_kernel<T, true>;
    PTRAIN_LAUNCH(fp8_quantize_blocks_kernel_instance, fp8_grid(tiles, kFp8Threads / kWarpSize, max_blocks), kFp8Threads, shared, stream, dst, amax,
                  counts, in, rows, cols, block_rows, block_cols, format);
  } else {
    auto fp8_quantize_blocks_kernel_instance = fp8_quantize_blocks_kernel<T, false>;
    PTRAIN_LAUNCH(fp8_quantize_blocks_kernel_instance, fp8_grid(tiles, 1, max_blocks), kFp8Threads, shared, stream, dst, amax, counts, in, rows,
                  cols, block_rows, block_cols, format);
  }
}

// A part of a weight cast on several ranks: `in` holds elements [first, first + n) of a
// (., cols) tensor. fp8_block_amax_part: amaxes[b - base] = max(itself, max |x|) over the
// part's elements of block b (numbered as part_block numbers them; base: the part's first
// block row's first block), NaN skipped; zero them first. fp8_encode_part: its codes (or with
// codes null the dequantised values) cast with scales[0] (scale_count 1) or each block's
// scales[b], scales in device memory; *amax and *counts as in fp8_cast.
template <typename T>
void fp8_block_amax_part(float* amaxes, int64_t base, const T* in, size_t n, int64_t first, int64_t cols,
                         int block_rows, int block_cols, cudaStream_t stream, int max_blocks = kFp8MaxBlocks) {
  if (n == 0) return;
  if (cols < 1 || block_rows < 1 || block_cols < 1) throw std::invalid_argument("fp8_block_amax_part: sizes must be positive");
  const int blocks = fp8_grid(ceil_div(n, static_cast<size_t>(kFp8PartRun)), kFp8Threads, max_blocks);
  PTRAIN_LAUNCH(fp8_block_amax_part_kernel<T>, blocks, kFp8Threads, 0, stream, amaxes, base, in, n, first, cols,
                block_rows, block_cols);
}
template <typename T>
void fp8_encode_part(fp8* codes, float* values, float* amax, Fp8Counts* counts, const T* in, size_t n, int64_t first,
                     int64_t cols, const float* scales, int scale_count, int block_rows, int block_cols,
                     __nv_fp8_interpretation_t format, cudaStream_t stream, int max_blocks = kFp8MaxBlocks) {
  if (n == 0) return;
  if (cols < 1 || block_rows < 1 || block_cols < 1 || scale_count < 1 || !codes == !values)
    throw std::invalid_argument("fp8_encode_part: positive sizes, scales, and codes or values expected");
  PTRAIN_LAUNCH(fp8_encode_part_kernel<T>, fp8_grid(n, kFp8Threads, max_blocks), kFp8Threads,
                kFp8TallyWords * sizeof(unsigned), stream, codes, values, amax, counts, in, n, first, cols, scales,
                scale_count, block_rows, block_cols, format);
}

// The row-major form: codes (rows, cols) and scale_inv (ceil(rows / block_rows),
// ceil(cols / block_cols)) row-major (what fp8_dequantize_blocks reads).
template <typename T>
void fp8_quantize_blocks(fp8* out, float* scale_inv, float* amax, Fp8Counts* counts, const T* in, int rows, int cols,
                         int block_rows, int block_cols, __nv_fp8_interpretation_t format, cudaStream_t stream,
                         int max_blocks = kFp8MaxBlocks) {
  Fp8BlockCodes dst;
  dst.codes = out;
  dst.scale_inv = scale_inv;
  dst.layout = BlockScaleLayout{block_cols >= 1 ? ceil_div(cols, block_cols) : 0, 1};
  fp8_quantize_blocks_into(dst, amax, counts, in, rows, cols, block_rows, block_cols, format, stream, max_blocks);
}

}  // namespace ptrain::kernels
