// Compiled only into CUDA builds (PTRAIN_HAVE_CUDA): calls cudart, cuBLASLt and cuDNN.
#ifdef PTRAIN_HAVE_CUDA

#include "backend/cuda/cuda_error.h"

#include <cudnn.h>

#include <utility>

namespace ptrain {

namespace {

std::string make_message(const std::string& library, long long status, const std::string& status_name,
                         const std::string& description, const std::string& expression, const std::string& file,
                         int line) {
  std::string text = library + " error " + status_name + " (" + std::to_string(status) + ")";
  if (!description.empty()) text += ": " + description;
  if (!expression.empty()) text += "; in " + expression;
  if (!file.empty()) text += " at " + file + ":" + std::to_string(line);
  return text;
}

std::string or_unknown(const char* s) { return s && *s ? std::string(s) : std::string("unknown status"); }

}  // namespace

CudaError::CudaError(std::string library, long long status, std::string status_name, std::string description,
                     std::string expression, std::string file, int line)
    : EnvironmentError(make_message(library, status, status_name, description, expression, file, line)),
      library_(std::move(library)),
      status_(status),
      status_name_(std::move(status_name)),
      description_(std::move(description)),
      expression_(std::move(expression)),
      file_(std::move(file)),
      line_(line) {}

std::string cuda_status_name(cudaError_t status) { return or_unknown(cudaGetErrorName(status)); }

std::string cublas_status_name(cublasStatus_t status) {
  // cublasLt's own copies of cublasGetStatusName/String: no libcublas needed.
  return or_unknown(cublasLtGetStatusName(status));
}

void throw_cuda_error(cudaError_t status, const char* expression, const char* file, int line) {
  (void)cudaGetLastError();  // reset the non-sticky last error this failure left behind
  std::string description;
  switch (status) {
    case cudaErrorMemoryAllocation:
      description = "out of GPU memory";
      break;
    case cudaErrorInsufficientDriver:
      description = or_unknown(cudaGetErrorString(status)) + " (no usable NVIDIA driver or GPU on this machine?)";
      break;
    case cudaErrorNoDevice:
      description = or_unknown(cudaGetErrorString(status)) + " (is CUDA_VISIBLE_DEVICES hiding every GPU?)";
      break;
    default:
      description = or_unknown(cudaGetErrorString(status));
  }
  throw CudaError("CUDA", static_cast<long long>(status), cuda_status_name(status), description,
                  expression ? expression : "", file ? file : "", line);
}

void throw_cublas_error(cublasStatus_t status, const char* expression, const char* file, int line) {
  std::string description = or_unknown(cublasLtGetStatusString(status));
  if (status == CUBLAS_STATUS_NOT_INITIALIZED)
    description += " (no usable NVIDIA driver or GPU on this machine?)";
  throw CudaError("cuBLASLt", static_cast<long long>(status), cublas_status_name(status), description,
                  expression ? expression : "", file ? file : "", line);
}

void throw_cudnn_error(int status, const char* expression, const char* file, int line) {
  const cudnnStatus_t s = static_cast<cudnnStatus_t>(status);
  std::string name = or_unknown(cudnnGetErrorString(s));
  // cuDNN 9 statuses are grouped by thousands; the last-error string, when cuDNN left one, says
  // which parameter or sub-library was at fault.
  std::string description;
  switch (status / 1000) {
    case 1: description = "cuDNN could not start (no usable GPU or driver, or a mismatched cuDNN sub-library)"; break;
    case 2: description = "bad parameter"; break;
    case 3: description = "not supported for this configuration or GPU"; break;
    case 4: description = "internal error"; break;
    case 5: description = "execution failed"; break;
    default: description = "cuDNN failure";
  }
  char detail[512] = {0};
  cudnnGetLastErrorString(detail, sizeof(detail));
  if (detail[0]) description += std::string(": ") + detail;
  throw CudaError("cuDNN", static_cast<long long>(status), name, description, expression ? expression : "",
                  file ? file : "", line);
}

}  // namespace ptrain

#endif  // PTRAIN_HAVE_CUDA
