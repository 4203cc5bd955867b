// Checkpoints last: tests/fixtures/checkpoint-v1 was written by ptrain 0.1.0 before state.json
// had a format_version. Every later version must resume it, and the resumed run must continue
// as a checkpoint written by today's code does.
#include <catch2/catch.hpp>

#include <cmath>

#include "test_util.h"

using namespace ptrain;
using namespace ptrain::test;
namespace fs = std::filesystem;

namespace {

std::vector<double> losses_after(const fs::path& metrics, int64_t step) {
  std::vector<double> out;
  for (const auto& r : read_metrics(metrics))
    if (r.contains("loss") && r["step"].get<int64_t>() > step) out.push_back(r["loss"].get<double>());
  return out;
}

}  // namespace

TEST_CASE("a checkpoint written by ptrain 0.1.0 (format version 1, unmarked) still resumes", "[checkpoint]") {
  TempDir temp("format");
  const fs::path fixture = source_dir() / "tests/fixtures/checkpoint-v1";
  fs::copy(fixture, temp.dir, fs::copy_options::recursive);
  REQUIRE_FALSE(nlohmann::json::parse(read_file(temp.dir / "step_00000004/state.json")).contains("format_version"));

  // Today's code makes the same checkpoint afresh: the same config, 4 steps.
  const CommandResult fresh = run_ptrain("train config.yaml --set run.name=today", temp.dir);
  INFO(fresh.output);
  REQUIRE(fresh.exit_code == 0);
  const fs::path today = temp.dir / "runs/today/checkpoints/step_00000004";
  const nlohmann::json today_state = nlohmann::json::parse(read_file(today / "state.json"));
  CHECK(today_state["format_version"] == 1);
  // The comparison below is of two runs that took the same path: no step of either overflowed
  // (a step one CPU's rounding overflowed and another's did not would part them at once).
  CHECK(today_state["loss_scaler"] ==
        nlohmann::json::parse(read_file(temp.dir / "step_00000004/state.json"))["loss_scaler"]);

  // Both continue to step 6.
  auto resume = [&](const std::string& name, const fs::path& from) {
    const CommandResult r = run_ptrain("train config.yaml --set run.name=" + name + " --set training.steps=6 " +
                                           "--set checkpoint.resume=" + from.string(),
                                       temp.dir);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("resumed from " + from.string() + " after step 4") != std::string::npos);
    return losses_after(temp.dir / "runs" / name / "metrics.jsonl", 4);
  };
  const std::vector<double> old_format = resume("from-fixture", temp.dir / "step_00000004");
  const std::vector<double> new_format = resume("from-today", today);
  REQUIRE(old_format.size() == 2);
  REQUIRE(new_format.size() == 2);
  // On a CPU whose BLAS kernels sum as the fixture's machine did (AMD EPYC, OpenBLAS Zen), the
  // two checkpoints are the same bytes and the runs agree bit for bit; elsewhere the weights
  // differ in their last bits and the losses agree closely.
  const bool same_bytes = read_file(today / "weights.safetensors") == read_file(temp.dir / "step_00000004/weights.safetensors");
  for (size_t i = 0; i < old_format.size(); ++i) {
    INFO("step " << 5 + i << (same_bytes ? " (same checkpoint bytes)" : " (other BLAS kernels)"));
    REQUIRE(std::isfinite(old_format[i]));
    if (same_bytes)
      CHECK(old_format[i] == new_format[i]);
    else
      CHECK(old_format[i] == Approx(new_format[i]).epsilon(1e-4));
  }
}
