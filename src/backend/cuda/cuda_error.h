// Errors from the CUDA runtime and NVIDIA's libraries (cuBLASLt, cuDNN, NCCL) as one typed
// exception. A failed library call is an environment failure, not a user error: the CLI reports
// it without "internal error" and exits with code 1 (see core/error.h).
//
// Every call into a library goes through one of the check macros, which funnel into one
// [[noreturn]] function per library so the error text is built in one place:
//
//   PTRAIN_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
//   PTRAIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
//   PTRAIN_CUDNN_CHECK(cudnnBackendFinalize(graph));   // the caller includes <cudnn.h>
//
// what() reads, e.g.
//   "CUDA error cudaErrorInsufficientDriver (35): CUDA driver version is insufficient for CUDA
//    runtime version (no usable NVIDIA driver or GPU on this machine?); in cudaGetDeviceCount(&n)
//    at src/backend/cuda/cuda_backend.cu:31"
//
// This header needs the CUDA runtime and cuBLASLt headers only; cuDNN statuses are passed as
// int so that including it does not pull in cudnn.h. The .cpp calls cudart, cuBLASLt and cuDNN.
#pragma once

#include <cublasLt.h>  // cublasStatus_t (through cublas_api.h)
#include <cuda_runtime_api.h>

#include <string>

#include "core/error.h"

namespace ptrain {

class CudaError : public EnvironmentError {
 public:
  // library: "CUDA", "cuBLASLt", "cuDNN" or "NCCL". status: the library's numeric status;
  // status_name: its symbolic name ("cudaErrorMemoryAllocation", "CUBLAS_STATUS_NOT_SUPPORTED");
  // description: readable text; expression: the failed call as written; file/line: where.
  CudaError(std::string library, long long status, std::string status_name, std::string description,
            std::string expression, std::string file, int line);

  const std::string& library() const { return library_; }
  long long status() const { return status_; }
  const std::string& status_name() const { return status_name_; }
  const std::string& description() const { return description_; }
  const std::string& expression() const { return expression_; }
  const std::string& file() const { return file_; }
  int line() const { return line_; }

 private:
  std::string library_;
  long long status_;
  std::string status_name_;
  std::string description_;
  std::string expression_;
  std::string file_;
  int line_;
};

// Build and throw the CudaError for a failed call. throw_cuda_error also clears the runtime's
// last-error state (cudaGetLastError), so that a caller that catches the error (e.g. an
// allocation retried smaller) does not see it again from the next launch check.
[[noreturn]] void throw_cuda_error(cudaError_t status, const char* expression, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expression, const char* file, int line);
// status is a cudnnStatus_t (CUDNN_STATUS_SUCCESS is 0).
[[noreturn]] void throw_cudnn_error(int status, const char* expression, const char* file, int line);

// Symbolic names, e.g. "cudaErrorInsufficientDriver", "CUBLAS_STATUS_NOT_INITIALIZED".
std::string cuda_status_name(cudaError_t status);
std::string cublas_status_name(cublasStatus_t status);

}  // namespace ptrain

#define PTRAIN_CUDA_CHECK(expr)                                                              \
  do {                                                                                       \
    const cudaError_t ptrain_cuda_status_ = (expr);                                          \
    if (ptrain_cuda_status_ != cudaSuccess)                                                  \
      ::ptrain::throw_cuda_error(ptrain_cuda_status_, #expr, __FILE__, __LINE__);            \
  } while (0)

#define PTRAIN_CUBLAS_CHECK(expr)                                                            \
  do {                                                                                       \
    const cublasStatus_t ptrain_cublas_status_ = (expr);                                     \
    if (ptrain_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                      \
      ::ptrain::throw_cublas_error(ptrain_cublas_status_, #expr, __FILE__, __LINE__);        \
  } while (0)

#define PTRAIN_CUDNN_CHECK(expr)                                                             \
  do {                                                                                       \
    const int ptrain_cudnn_status_ = static_cast<int>(expr);                                 \
    if (ptrain_cudnn_status_ != 0)                                                           \
      ::ptrain::throw_cudnn_error(ptrain_cudnn_status_, #expr, __FILE__, __LINE__);          \
  } while (0)
