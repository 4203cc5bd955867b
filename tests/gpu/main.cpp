// The GPU tests' entry point. With fewer usable CUDA devices than PTRAIN_GPUS_NEEDED (1; the
// multi-GPU tests build it with 2) every test reports "skipped" to ctest (exit code 77, the
// tests' SKIP_RETURN_CODE), never "passed". Listing the tests (which CMake does at build time)
// works everywhere.
#include <cstdio>
#include <cstring>

#include "backend/device.h"
#include "catch/run.h"

#ifndef PTRAIN_GPUS_NEEDED
#define PTRAIN_GPUS_NEEDED 1
#endif

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::strncmp(argv[i], "--list", 6) == 0;
  if (!listing) {
    const ptrain::CudaProbe probe = ptrain::probe_cuda();
    if (probe.devices.size() < PTRAIN_GPUS_NEEDED) {
      std::printf("skipped: %zu usable CUDA device(s), these tests need %d%s%s\n", probe.devices.size(),
                  PTRAIN_GPUS_NEEDED, probe.why_none.empty() ? "" : ": ", probe.why_none.c_str());
      return 77;
    }
  }
  return ptrain::test::run_catch(argc, argv);
}
