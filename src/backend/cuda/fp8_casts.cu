// The FP8 casts (Backend::fp8_cast, fp8_cast_blocks): an operand quantised to E4M3/E5M2 codes
// with a per-tensor scale or per-block factors, and dequantised back into its buffer, with the
// statistics the precision policy chooses its scales by (amax, values that underflowed to zero
// or saturated), counted on the device and read back once the cast is done. And a part of a
// weight cast with scales several ranks agreed on (fp8_block_amaxes, fp8_encode).
#include "backend/cuda/cuda_backend_impl.h"

#include <algorithm>
#include <vector>

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

// A part of a weight's block amaxes: the kernel gathers those of the block rows the part
// touches into scratch, and the host array takes their maxima.
void CudaBackend::fp8_block_amaxes(float* amaxes, Tensor part, int64_t first, int64_t cols, int block_rows,
                                   int block_cols) {
  const char* op = "fp8_block_amaxes";
  expect_float(op, "part", part);
  PTRAIN_EXPECT(first >= 0 && cols > 0 && block_rows > 0 && block_cols > 0, op,
                "a place in the tensor and positive block sizes expected");
  const int64_t n = part.numel();
  if (n == 0) return;
  const int64_t tile_cols = (cols + block_cols - 1) / block_cols;
  const int64_t row0 = first / cols / block_rows, row1 = (first + n - 1) / cols / block_rows;
  const int64_t base = row0 * tile_cols, count = (row1 - row0 + 1) * tile_cols;
  float* device = scratch_floats(kFp8ScaleInv, static_cast<size_t>(count));
  PTRAIN_CUDA_CHECK(cudaMemsetAsync(device, 0, static_cast<size_t>(count) * sizeof(float), stream_));
  with_float_type(part.dtype, op, [&](auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    kernels::fp8_block_amax_part<T>(device, base, part.as<T>(), static_cast<size_t>(n), first, cols, block_rows,
                                    block_cols, stream_);
  });
  std::vector<float> found(static_cast<size_t>(count));
  PTRAIN_CUDA_CHECK(cudaMemcpyAsync(found.data(), device, found.size() * sizeof(float), cudaMemcpyDeviceToHost, stream_));
  sync();
  for (int64_t k = 0; k < count; ++k) amaxes[base + k] = std::max(amaxes[base + k], found[static_cast<size_t>(k)]);
}

// The part's codes (u8 out) or dequantised values (f32 out), with the scales copied to scratch.
Fp8CastStats CudaBackend::fp8_encode(Tensor out, Tensor part, Format format, const std::vector<float>& scales,
                                     int64_t first, int64_t cols, int block_rows, int block_cols) {
  const char* op = "fp8_encode";
  expect_float(op, "part", part);
  PTRAIN_EXPECT(is_fp8(format), op, std::string("the format must be e4m3 or e5m2, got ") + format_name(format));
  PTRAIN_EXPECT((out.dtype == DType::u8 || out.dtype == DType::f32) && out.numel() == part.numel(), op,
                "out must be u8 codes or f32 values, as many as the part's " + part.shape_string());
  PTRAIN_EXPECT(!scales.empty() && first >= 0 && cols > 0 && block_rows > 0 && block_cols > 0, op,
                "scales, a place in the tensor and positive block sizes expected");
  const int64_t n = part.numel();
  if (n == 0) return Fp8CastStats{};
  float* device_scales = scratch_floats(kFp8ScaleInv, scales.size());
  PTRAIN_CUDA_CHECK(cudaMemcpyAsync(device_scales, scales.data(), scales.size() * sizeof(float),
                                    cudaMemcpyHostToDevice, stream_));
  reset_scalars(1.0f);
  fp8* codes = out.dtype == DType::u8 ? out.as<fp8>() : nullptr;
  float* values = out.dtype == DType::f32 ? out.as<float>() : nullptr;
  with_float_type(part.dtype, op, [&](auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    kernels::fp8_encode_part<T>(codes, values, amax_ptr(), counts_ptr(), part.as<T>(), static_cast<size_t>(n), first,
                                cols, device_scales, to_int(static_cast<int64_t>(scales.size()), op, "scales"),
                                block_rows, block_cols, fp8_interpretation(format), stream_);
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
