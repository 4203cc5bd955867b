// The tmpfs tests' entry point: where this process may not mount a tmpfs (no privileges, a
// container that forbids it) every test reports "skipped" to ctest (exit 77), never "passed".
#include <cstdio>
#include <cstring>

#include "catch/run.h"
#include "tmpfs.h"

int main(int argc, char** argv) {
  bool listing = false;
  for (int i = 1; i < argc; ++i) listing = listing || std::strncmp(argv[i], "--list", 6) == 0;
  if (!listing) {
    try {
      ptrain::test::Tmpfs probe(1 << 20);
    } catch (const std::exception& e) {
      std::printf("skipped: these tests need to mount a tmpfs, and %s\n", e.what());
      return 77;
    }
  }
  return ptrain::test::run_catch(argc, argv);
}
