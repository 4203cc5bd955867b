// What `ptrain bench --profile` reports: each op family's time exclusive of the families it
// calls, only inside optimizer steps, medians over the steps after the first, the GEMMs' rate from
// their FLOPs; then the real benchmark's table on a small model (structure, not speed).
#include <catch2/catch.hpp>

#include <algorithm>
#include <regex>

#include "bad_input.h"
#include "backend/op_profile.h"

using namespace ptrain;
using ptrain::test::BadInputWorkspace;
using ptrain::test::CommandResult;

namespace {

// A clock the test moves by hand.
OpProfile::Clock::time_point fake_time;
OpProfile::Clock::time_point fake_now() { return fake_time; }
void advance_ms(double ms) { fake_time += std::chrono::microseconds(static_cast<int64_t>(ms * 1000)); }

double row_ms(const OpProfile::Summary& s, OpFamily f) {
  for (const auto& r : s.rows)
    if (r.family == f) return r.ms;
  return 0;
}

}  // namespace

TEST_CASE("op profile: exclusive times per family, inside steps only, medians after the first step", "[profile]") {
  OpProfile p(&fake_now);
  const double step_ms[] = {100, 40, 50, 60};
  for (int step = 0; step < 4; ++step) {
    p.begin_step();
    p.begin(OpFamily::norms);
    advance_ms(step + 1);  // layernorm's own time: 1, 2, 3, 4 ms
    p.begin(OpFamily::rounding);
    advance_ms(10);  // charged to rounding, not to the layernorm that called it
    p.end();
    advance_ms(1);
    p.end();
    p.begin(OpFamily::gemm);
    advance_ms(20);
    p.add_gemm("8x8x8 NN", 2e9, 20e-3);
    p.end();
    advance_ms(3);  // between ops: nobody's
    p.end_step(step_ms[step] / 1e3);
    p.begin(OpFamily::gemm);  // an evaluation between steps is not counted
    advance_ms(500);
    p.add_gemm("8x8x8 NN", 1e12, 0.5);
    p.end();
  }
  const OpProfile::Summary s = p.summary();
  CHECK(s.steps == 3);
  CHECK(s.step_ms == Approx(50));
  CHECK(row_ms(s, OpFamily::norms) == Approx(4));  // steps 2-4: 2, 3, 4 ms own time + 1 ms after rounding
  CHECK(row_ms(s, OpFamily::rounding) == Approx(10));
  CHECK(row_ms(s, OpFamily::gemm) == Approx(20));
  CHECK(row_ms(s, OpFamily::adamw) == 0);
  REQUIRE(s.rows.size() == 3);
  CHECK(s.rows.front().family == OpFamily::gemm);  // largest first
  CHECK(s.rows.front().share == Approx(20.0 / 50));
  CHECK(s.gemm_flops_per_s == Approx(2e9 / 20e-3));
  CHECK(s.outside_ms == Approx(16));  // steps of 40, 50, 60 ms less their 33, 34, 35 ms of ops
  REQUIRE(s.gemm_shapes.size() == 1);
  CHECK(s.gemm_shapes[0].ms == Approx(20));
  CHECK(s.gemm_shapes[0].flops_per_s == Approx(1e11));
  const std::string table = format_profile(s, 2e11);
  CHECK(table.find("50 % of the sgemm ceiling") != std::string::npos);
}

TEST_CASE("bench --profile prints where the step's time goes, the GEMMs' rate beside the ceiling", "[profile]") {
  BadInputWorkspace ws;
  const CommandResult r = ws.ptrain("bench run.yaml --profile --set training.steps=4 --set checkpoint.save_final=false");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::smatch m;
  REQUIRE(std::regex_search(r.output, m, std::regex(R"(median step\s+([0-9.]+) ms)")));
  const double step_ms = std::stod(m[1].str());
  REQUIRE(std::regex_search(r.output, m, std::regex(R"(sgemm ceiling\s+([0-9.]+) GFLOP/s)")));
  const double ceiling = std::stod(m[1].str());
  // Every family a GPT step runs has a line: ms per step, its share of the median step.
  for (const char* family : {"GEMMs", "attention", "classifier", "norms", "activations", "AdamW", "embedding"}) {
    CAPTURE(family);
    REQUIRE(std::regex_search(r.output, m, std::regex(std::string(R"(\n  )") + family + R"([^\n]*?\s([0-9.]+) ms\s+([0-9.]+) %)")));
    const double ms = std::stod(m[1].str()), share = std::stod(m[2].str());
    CHECK(ms <= step_ms);
    // Both times are printed to 0.05 ms and the share to 0.05 %: it lies within what those allow.
    const double lowest = 100 * std::max(0.0, ms - 0.05) / (step_ms + 0.05);
    const double highest = 100 * (ms + 0.05) / std::max(0.05, step_ms - 0.05);
    CHECK(share >= lowest - 0.051);
    CHECK(share <= highest + 0.051);
  }
  REQUIRE(std::regex_search(r.output, m, std::regex(R"(([0-9.]+) GFLOP/s, ([0-9]+) % of the sgemm ceiling)")));
  CHECK(std::stod(m[2].str()) == Approx(100 * std::stod(m[1].str()) / ceiling).margin(1.0));
}
