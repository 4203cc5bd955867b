// The GPU tests' entry point. Without a usable CUDA device every test reports "skipped" to ctest
// (exit code 77, the tests' SKIP_RETURN_CODE), never "passed". Listing the tests (which CMake
// does at build time) works everywhere.
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
    if (probe.devices.empty()) {
      std::printf("skipped: no usable CUDA device: %s\n", probe.why_none.c_str());
      return 77;
    }
  }
  return Catch::Session().run(argc, argv);
}
