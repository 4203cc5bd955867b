// Named ranges on Nsight Systems timelines (step, forward, backward, optimizer, each layer). In
// a CUDA build they are NVTX ranges (header-only; free when no profiler is attached); without
// CUDA they compile to nothing.
#pragma once

#ifdef PTRAIN_HAVE_CUDA
#include <nvtx3/nvToolsExt.h>
#endif

namespace ptrain {

class NvtxRange {
 public:
#ifdef PTRAIN_HAVE_CUDA
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
#else
  explicit NvtxRange(const char*) {}
#endif
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace ptrain
