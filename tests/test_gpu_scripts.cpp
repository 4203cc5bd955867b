// The GPU check's scripts and ptrain devices, on a machine without a GPU: what a borrowed GPU's
// first minutes depend on must be right before they start.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "test_util.h"

namespace ptrain::test {
namespace {

namespace fs = std::filesystem;

std::string gpu_check(const std::string& args, const std::string& env = "") {
  return "cd '" + source_dir().string() + "' && " + env + " ./scripts/gpu-check.sh " + args;
}

TEST_CASE("gpu-check.sh --plan prints every stage's steps without a GPU or a bundle", "[gpu-scripts]") {
  const CommandResult r = run_shell(gpu_check("--plan"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  for (const char* expected :
       {"correctness (budget 540s)", "ptrain devices", "each test of ptrain_gpu_tests in its own process",
        "fp8:block) on cuda and on cpu", "speed (budget 540s)", "124m fp8 recipe=block", "774m bf16",
        "sanitize (budget 540s)", "memcheck --nvtx yes", "racecheck on every backend op and kernel test",
        "-w NoTests"}) {
    INFO("expected: " << expected);
    CHECK(r.output.find(expected) != std::string::npos);
  }
}

TEST_CASE("gpu-check.sh --plan speed keeps only the rows its filter matches", "[gpu-scripts]") {
  const CommandResult r = run_shell(gpu_check("--plan speed '^124m fp8'"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("124m fp8 recipe=current") != std::string::npos);
  CHECK(r.output.find("124m fp8 recipe=delayed") != std::string::npos);
  CHECK(r.output.find("124m bf16") == std::string::npos);
  CHECK(r.output.find("350m") == std::string::npos);
  CHECK(r.output.find("correctness (") == std::string::npos);
}

TEST_CASE("gpu-check.sh refuses an unknown stage with its usage", "[gpu-scripts]") {
  const CommandResult r = run_shell(gpu_check("speedy"));
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("scripts/gpu-check.sh correctness") != std::string::npos);
}

TEST_CASE("gpu-check.sh without a bundle fails at once and leaves its summary in OUT", "[gpu-scripts]") {
  const fs::path dir = make_temp_dir("gpu-check");
  const CommandResult r =
      run_shell(gpu_check("correctness", "OUT='" + dir.string() + "' PTRAIN_GPU_BUNDLE='" + (dir / "none.tar.xz").string() + "'"));
  INFO(r.output);
  CHECK(r.exit_code == 1);
  const std::string summary = read_file(dir / "correctness-summary.txt");
  CHECK(summary.find("FAIL") != std::string::npos);
  CHECK(summary.find("no bundle at") != std::string::npos);
  CHECK(fs::exists(dir / "correctness.log"));
  CHECK(fs::exists(dir / "correctness-details.tar.gz"));
  fs::remove_all(dir);
}

TEST_CASE("ptrain devices names the libraries and why no GPU is usable", "[gpu-scripts]") {
  const fs::path dir = make_temp_dir("devices");
  const CommandResult r = run_ptrain("devices", dir);
  INFO(r.output);
  CHECK(r.exit_code == 0);
#ifdef PTRAIN_HAVE_CUDA
  CHECK(r.output.find("built against CUDA ") != std::string::npos);
  CHECK(r.output.find("loaded: CUDA runtime ") != std::string::npos);
  CHECK(r.output.find(", cuDNN 9.") != std::string::npos);
#endif
  // This machine may have a GPU; then it is listed, else the reason is.
  CHECK((r.output.find("no usable CUDA device: ") != std::string::npos ||
         r.output.find("cuda:0 ") != std::string::npos));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ptrain::test
