// The FP8 casts (Backend::fp8_cast, fp8_cast_blocks): an operand quantised to E4M3/E5M2 codes
// with a per-tensor scale or per-block factors, and dequantised back into its buffer, with the
// statistics the precision policy chooses its scales by (amax, values that underflowed to zero
// or saturated), counted on the device and read back once the cast is done.
#include "backend/cuda/cuda_backend_impl.h"

#include "backend/cuda/kernel_formats.h"
#include "convert.cuh"

namespace ptrain::cuda_impl {

Fp8CastStats to_stats(const DeviceScalars& d) {
  Fp8CastStats stats;
  stats.amax = d.amax;
  stats.nonzero = static_cast<int64_t>(d.counts.nonzero);
  stats.underflow = static_cast<int64_t>(d.counts.underflow);
  stats.saturated = static_cast<int64_t>(d.counts.saturated);
  return stats;
}

// kernels::fp8_cast writes the codes and the statistics; the dequantised output is
// code value * (1.0f / scale), the CPU's expression, bit for bit. `out` is not rounded to
// any format: it holds exactly the dequantised values.
Fp8CastStats CudaBackend::fp8_cast(Tensor out, Tensor in, Format format, float scale) {
  const char* op = "fp8_cast";
  expect_floats(op, {{"out", &out}, {"in", &in}});
  PTRAIN_EXPECT(is_fp8(format), op, std::string("the format must be e4m3 or e5m2, got ") + format_name(format));
  PTRAIN_EXPECT(out.numel() == in.numel(), op,
                "in " + in.shape_string() + " and out " + out.shape_string() + " differ in size");
  const int64_t n = in.numel();
  if (n == 0) return Fp8CastStats{};
  const int64_t cols = last_dim(in);
  const int rows_i = to_int(n / cols, op, "rows"), cols_i = to_int(cols, op, "columns");
  fp8* codes = static_cast<fp8*>(scratch(kFp8Codes, static_cast<size_t>(n)));
  const __nv_fp8_interpretation_t fmt = fp8_interpretation(format);
  reset_scalars(scale);
  with_float_type(in.dtype, op, [&](auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    kernels::fp8_cast<T>(codes, nullptr, amax_ptr(), counts_ptr(), in.as<T>(), rows_i, cols_i, scale_ptr(), fmt,
                         stream_);
  });
  const float inv_scale = 1.0f / scale;
  with_float_type(out.dtype, op, [&](auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    kernels::fp8_dequantize<T>(out.as<T>(), codes, static_cast<size_t>(n), inv_scale, fmt, stream_);
  });
  return read_fp8_stats();
}

Fp8CastStats CudaBackend::fp8_cast_blocks(Tensor out, Tensor in, Format format, int block_rows, int block_cols) {
  const char* op = "fp8_cast_blocks";
  expect_floats(op, {{"out", &out}, {"in", &in}});
  PTRAIN_EXPECT(is_fp8(format), op, std::string("the format must be e4m3 or e5m2, got ") + format_name(format));
  PTRAIN_EXPECT(block_rows >= 1 && block_cols >= 1, op, "block sizes must be positive");
  PTRAIN_EXPECT(out.numel() == in.numel(), op,
                "in " + in.shape_string() + " and out " + out.shape_string() + " differ in size");
  const int64_t n = in.numel();
  if (n == 0) return Fp8CastStats{};
  const int64_t cols = last_dim(in), rows = n / cols;
  const int rows_i = to_int(rows, op, "rows"), cols_i = to_int(cols, op, "columns");
  const int64_t tile_rows = (rows + block_rows - 1) / block_rows, tile_cols = (cols + block_cols - 1) / block_cols;
  to_int(tile_rows * tile_cols, op, "blocks");
  fp8* codes = static_cast<fp8*>(scratch(kFp8Codes, static_cast<size_t>(n)));
  float* scale_inv = scratch_floats(kFp8ScaleInv, static_cast<size_t>(tile_rows * tile_cols));
  const __nv_fp8_interpretation_t fmt = fp8_interpretation(format);
  reset_scalars(1.0f);
  with_float_type(in.dtype, op, [&](auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    kernels::fp8_quantize_blocks<T>(codes, scale_inv, amax_ptr(), counts_ptr(), in.as<T>(), rows_i, cols_i, block_rows,
                                    block_cols, fmt, stream_);
  });
  with_float_type(out.dtype, op, [&](auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    kernels::fp8_dequantize_blocks<T>(out.as<T>(), codes, scale_inv, rows_i, cols_i, block_rows, block_cols, fmt,
                                      stream_);
  });
  return read_fp8_stats();
}

// Before an FP8 cast: zeroes the device scalars (counts, amax, result) and sets the cast's
// scale, in stream order. A copy from pageable host memory is staged before cudaMemcpyAsync
// returns, so `scale` may go away at once.
void CudaBackend::reset_scalars(float scale) {
  PTRAIN_CUDA_CHECK(cudaMemsetAsync(scalars_, 0, sizeof(DeviceScalars), stream_));
  PTRAIN_CUDA_CHECK(cudaMemcpyAsync(scale_ptr(), &scale, sizeof(float), cudaMemcpyHostToDevice, stream_));
}

Fp8CastStats CudaBackend::read_fp8_stats() {
  DeviceScalars host{};
  PTRAIN_CUDA_CHECK(cudaMemcpyAsync(&host, scalars_, sizeof(DeviceScalars), cudaMemcpyDeviceToHost, stream_));
  sync();
  return to_stats(host);
}

}  // namespace ptrain::cuda_impl
