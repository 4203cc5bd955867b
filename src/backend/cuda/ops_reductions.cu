// Sums and amax, results the host reads: sums in double over reduce.cuh's fixed grid of partial
// sums (bit-identical run to run, whatever the device), queued on the stream for the host to read
// or added to a device total (the trainer's loss, read once a step).
#include "backend/cuda/cuda_backend_impl.h"

#include "reduce.cuh"

namespace ptrain::cuda_impl {

void CudaBackend::sum_into(Tensor out, Tensor t) {
  PTRAIN_EXPECT(out.dtype == DType::f64 && out.numel() == 1 && out.device == Device::cuda, "sum_into",
                "out must be one f64 element in device memory");
  queue_reduce("sum_into", t, false, out.as<double>());
}

float CudaBackend::amax(Tensor t) {
  const char* op = "amax";
  expect_float(op, "t", t);
  const size_t n = t.empty() ? 0 : static_cast<size_t>(t.numel());
  if (n == 0) return 0.0f;
  float* device_amax = amax_ptr();
  PTRAIN_CUDA_CHECK(cudaMemsetAsync(device_amax, 0, sizeof(float), stream_));
  with_float_type(t.dtype, op, [&](auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    kernels::amax<T>(device_amax, t.as<T>(), n, stream_);
  });
  float result = 0.0f;
  PTRAIN_CUDA_CHECK(cudaMemcpyAsync(&result, device_amax, sizeof(float), cudaMemcpyDeviceToHost, stream_));
  sync();
  return result;
}

double CudaBackend::reduce(const char* op, const Tensor& t, bool squares) {
  double* device_result = result_ptr();
  queue_reduce(op, t, squares, device_result);
  double result = 0.0;
  PTRAIN_CUDA_CHECK(cudaMemcpyAsync(&result, device_result, sizeof(double), cudaMemcpyDeviceToHost, stream_));
  sync();
  return result;
}

// *device_out = the sum (of squares) of t, queued on the stream.
void CudaBackend::queue_reduce(const char* op, const Tensor& t, bool squares, double* device_out) {
  expect_float(op, "t", t);
  const size_t n = t.empty() ? 0 : static_cast<size_t>(t.numel());
  if (n == 0) {
    PTRAIN_CUDA_CHECK(cudaMemsetAsync(device_out, 0, sizeof(double), stream_));
    return;
  }
  double* partials = static_cast<double*>(scratch(kReduce, kernels::kReducePartials * sizeof(double)));
  with_float_type(t.dtype, op, [&](auto tag) {
    PTRAIN_ELEMENT_TYPE(T, tag);
    kernels::double_sum<T>(device_out, partials, t.as<T>(), n, squares, stream_);
  });
}

}  // namespace ptrain::cuda_impl
