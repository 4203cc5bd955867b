// CUDA graphs of the training step: the work of `body` captured from the backend's stream and
// replayed as one launch, which removes the host's launch overhead of a few hundred small
// kernels per step. Capture must fail as a refusal, not as an error, whenever the work cannot be
// recorded (a synchronisation, a pageable copy, a library that declines): the trainer then runs
// the step without a graph.
#include "backend/cuda/cuda_backend_impl.h"

namespace ptrain::cuda_impl {
namespace {

// An instantiated CUDA graph, launched on the backend's stream.
class CudaGraph final : public RecordedWork {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;
  ~CudaGraph() override { (void)cudaGraphExecDestroy(exec_); }
  void replay() override { PTRAIN_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

}  // namespace

// Stream capture in thread-local mode: a synchronisation or a copy between the device and
// pageable memory inside `body` fails the capture (a CudaError with a capture status), and a
// library call that cannot be captured fails with its library's error; either ends the
// recording as a refusal. An arena allocation inside `body` calls no CUDA allocator, so it does
// not fail the capture: its zeroing memset is recorded like other work, and the memory epoch
// (memory_epoch) tells the caller that the recording holds a block handed out during it.
std::unique_ptr<RecordedWork> CudaBackend::record(const std::function<void()>& body, std::string* why) {
  PTRAIN_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  std::string failure;
  try {
    body();
  } catch (const CudaError& e) {
    if (!refuses_capture(e)) {  // e.g. a fault of earlier work: not about recording
      end_failed_capture();
      throw;
    }
    failure = e.what();
  } catch (...) {
    end_failed_capture();
    throw;
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  if (failure.empty() && ended != cudaSuccess) failure = "cudaStreamEndCapture: " + cuda_status_name(ended);
  cudaGraphExec_t exec = nullptr;
  if (failure.empty()) {
    const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
    if (made != cudaSuccess) failure = "cudaGraphInstantiate: " + cuda_status_name(made);
  }
  if (graph) (void)cudaGraphDestroy(graph);  // the executable graph keeps what it needs
  (void)cudaGetLastError();                  // a failed capture is not an error of later calls
  if (!failure.empty()) {
    *why = failure;
    return nullptr;
  }
  return std::make_unique<CudaGraph>(exec, stream_);
}

// Whether `e`, thrown inside a capture, says the work cannot be captured.
bool CudaBackend::refuses_capture(const CudaError& e) {
  if (e.library() != "CUDA") return true;  // cuBLASLt or cuDNN declined to run inside a capture
  switch (static_cast<cudaError_t>(e.status())) {
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureMerge:
    case cudaErrorStreamCaptureUnmatched:
    case cudaErrorStreamCaptureUnjoined:
    case cudaErrorStreamCaptureIsolation:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorStreamCaptureWrongThread:
    case cudaErrorCapturedEvent:
    case cudaErrorNotPermitted: return true;
    default: return false;
  }
}

void CudaBackend::end_failed_capture() noexcept {
  cudaGraph_t partial = nullptr;
  if (cudaStreamEndCapture(stream_, &partial) == cudaSuccess && partial) (void)cudaGraphDestroy(partial);
  (void)cudaGetLastError();
}

}  // namespace ptrain::cuda_impl
