// ptrain without cuBLASLt: the library is loaded when the CUDA backend first calls it
// (src/backend/cuda/cublaslt_on_demand.cpp), so every command starts without it, and `ptrain
// devices` names what it could not load. The library file is hidden by /dev/null bound over it
// in a mount namespace of the command's own (unshare), which no other process sees.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "test_util.h"

using namespace ptrain::test;

TEST_CASE("without cuBLASLt every command starts, and devices names the library it could not load", "[mount][cuda]") {
  const std::string library = std::filesystem::canonical(PTRAIN_CUBLASLT_LIBRARY).string();
  const auto devices = [&](bool hidden) {
    return run_shell("unshare --mount sh -c '" + (hidden ? "mount --bind /dev/null " + library + " && " : std::string()) +
                     PTRAIN_BINARY " --version && " PTRAIN_BINARY " devices' 2>&1");
  };
  const CommandResult seen = devices(false);
  INFO(seen.output);
  REQUIRE(seen.exit_code == 0);
  CHECK(seen.output.find("loaded: CUDA runtime") != std::string::npos);
  CHECK(seen.output.find("cuBLASLt none") == std::string::npos);

  const CommandResult hidden = devices(true);
  INFO(hidden.output);
  CHECK(hidden.exit_code == 0);
  CHECK(hidden.output.find("ptrain " PTRAIN_VERSION) != std::string::npos);
  CHECK(hidden.output.find("cuBLASLt none (the CUDA backend needs cuBLASLt, and libcublasLt.so.") != std::string::npos);
  CHECK(hidden.output.find("could not be loaded") != std::string::npos);
}
