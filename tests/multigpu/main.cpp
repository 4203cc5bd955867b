// The multi-GPU tests' entry point: with fewer than two usable CUDA devices every test reports
// "skipped" to ctest (exit code 77), never "passed".
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>

#include "backend/device.h"

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::strncmp(argv[i], "--list", 6) == 0;
  if (!listing) {
    const ptrain::CudaProbe probe = ptrain::probe_cuda();
    if (probe.devices.size() < 2) {
      std::printf("skipped: %zu usable CUDA device(s), these tests need 2%s%s\n", probe.devices.size(),
                  probe.why_none.empty() ? "" : ": ", probe.why_none.c_str());
      return 77;
    }
  }
  return Catch::Session().run(argc, argv);
}
