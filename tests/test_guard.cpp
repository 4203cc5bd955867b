// training.guard: the divergence guard's decisions against their definition, and on runs made to
// diverge on purpose (a learning rate that warms up far too high): `stop` exits 4 naming the
// step, `skip` skips the spiking steps' updates and counts them, a resume across a skip equals
// the uninterrupted run, and a guard that never fires changes no loss.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "optim/divergence_guard.h"
#include "test_util.h"

namespace ptrain::test {
namespace {

namespace fs = std::filesystem;
using Verdict = DivergenceGuard::Verdict;

GuardConfig guard_config(const std::string& action, double zscore, int window, int steps) {
  GuardConfig g;
  g.action = action;
  g.spike_zscore = zscore;
  g.window = window;
  g.spike_steps = steps;
  return g;
}

TEST_CASE("the divergence guard: non-finite losses, and spikes held for K steps against the window", "[guard]") {
  DivergenceGuard stop(guard_config("stop", 0, 4, 1));
  CHECK(stop.observe(3.0).verdict == Verdict::ok);
  const DivergenceGuard::Finding nan = stop.observe(NAN);
  CHECK(nan.verdict == Verdict::stop);
  CHECK(nan.why == "the loss is nan");
  CHECK(stop.observe(INFINITY).verdict == Verdict::stop);
  CHECK(stop.observe(1e30).verdict == Verdict::ok);  // spikes are not watched with spike_zscore 0

  DivergenceGuard g(guard_config("skip", 3, 4, 2));
  for (const double v : {1.0, 1.2, 0.8, 1.0}) REQUIRE(g.observe(v).verdict == Verdict::ok);
  // mean 1.0, standard deviation sqrt(0.02) = 0.1414: 1.5 is 3.54 of them above.
  CHECK(g.observe(1.5).verdict == Verdict::ok);  // one spiking step: not yet
  const DivergenceGuard::Finding spike = g.observe(1.5);
  CHECK(spike.verdict == Verdict::skip);
  CHECK(spike.why.find("3.54 standard deviations above the mean of the last 4 steps (1)") != std::string::npos);
  CHECK(spike.why.find("for 2 steps in a row") != std::string::npos);
  // Spiking losses never entered the window: a normal loss is normal, and the run restarts.
  CHECK(g.observe(1.1).verdict == Verdict::ok);
  CHECK(g.observe(1.5).verdict == Verdict::ok);
  // 1.1 replaced the oldest (1.0): the window is 1.2 0.8 1.0 1.1 now; a restored guard agrees.
  DivergenceGuard copy(guard_config("skip", 3, 4, 2));
  copy.restore(g.state());
  CHECK(g.state().window == std::vector<double>{1.2, 0.8, 1.0, 1.1});
  CHECK(copy.observe(1.6).verdict == g.observe(1.6).verdict);
  CHECK(copy.observe(1.6).verdict == Verdict::skip);
}

// A small model whose learning rate warms up to 1.0 over 40 steps: stable for about 20 steps,
// then its loss climbs away.
std::string diverging_config(const std::string& guard) {
  return "run: {name: div, out_dir: runs, seed: 3, device: cpu}\n"
         "model: {n_layer: 2, n_head: 4, n_embd: 64, seq_len: 32, vocab_size: 64}\n"
         "data: {synthetic: {vocab: 64, order: 2, branching: 4, tokens: 60000, seed: 5}}\n"
         "training: {steps: 40, batch_tokens: 256, micro_batch: 8, eval_every: 0, eval_batches: 2, threads: 1,\n"
         "           grad_clip: 0, guard: " + guard + "}\n"
         "optimizer: {lr: 1.0, weight_decay: 0}\n"
         "schedule: {warmup_steps: 40, decay: constant}\n"
         "checkpoint: {every: 10, keep_last: 5, save_final: false}\n";
}

std::vector<double> losses(const fs::path& metrics) {
  std::vector<double> out;
  for (const auto& r : read_metrics(metrics))
    if (r.contains("loss")) out.push_back(r["loss"].get<double>());
  return out;
}

TEST_CASE("guard stop: a run made to diverge exits 4 at the spike, naming the step", "[guard]") {
  TempDir ws("guard");
  write_file(ws.dir / "run.yaml", diverging_config("{action: stop, spike_zscore: 4, window: 10, spike_steps: 2}"));
  const CommandResult r = run_ptrain("train run.yaml", ws.dir);
  INFO(r.output);
  CHECK(r.exit_code == 4);
  CHECK(r.output.find("training stopped by the divergence guard at step ") != std::string::npos);
  CHECK(r.output.find("standard deviations above the mean of the last 10 steps") != std::string::npos);
  int64_t stop_step = 0;
  for (const auto& m : read_metrics(ws.dir / "runs/div/metrics.jsonl"))
    if (m.contains("guard")) {
      CHECK(m["guard"] == "stop");
      stop_step = m["step"].get<int64_t>();
    }
  REQUIRE(stop_step > 11);  // after a full window
  CHECK(r.output.find("at step " + std::to_string(stop_step) + ":") != std::string::npos);
  // Steps before the spike were trained and logged; none after it.
  CHECK(losses(ws.dir / "runs/div/metrics.jsonl").size() == static_cast<size_t>(stop_step - 1));
}

TEST_CASE("guard skip: the spiking steps' updates are skipped and counted, and a resume across them is exact",
          "[guard]") {
  TempDir ws("guard");
  const std::string guard = "{action: skip, spike_zscore: 4, window: 10, spike_steps: 2}";
  write_file(ws.dir / "run.yaml", diverging_config(guard));
  const CommandResult r = run_ptrain("train run.yaml", ws.dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  int64_t skips = 0, first_skip = 0;
  for (const auto& m : read_metrics(ws.dir / "runs/div/metrics.jsonl"))
    if (m.contains("guard")) {
      CHECK(m["guard"] == "skip");
      if (skips++ == 0) first_skip = m["step"].get<int64_t>();
    }
  REQUIRE(skips > 0);
  const nlohmann::json summary = nlohmann::json::parse(read_file(ws.dir / "runs/div/summary.json"));
  CHECK(summary["guard_skipped_steps"].get<int64_t>() == skips);
  CHECK(count_of(r.output, "its update skipped") == static_cast<size_t>(skips));
  const std::vector<double> whole = losses(ws.dir / "runs/div/metrics.jsonl");
  CHECK(whole.size() == 40);

  // The same run stopped at step 30 (checkpoint 30 keeps the guard's window) and resumed.
  write_file(ws.dir / "split.yaml", diverging_config(guard));
  REQUIRE(run_ptrain("train split.yaml --set run.name=split --stop-at 30", ws.dir).exit_code == 0);
  const CommandResult resumed = run_ptrain("train split.yaml --set run.name=split --set checkpoint.resume=auto", ws.dir);
  INFO(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  std::vector<double> split;  // the last record of each step counts
  std::map<int64_t, double> by_step;
  for (const auto& m : read_metrics(ws.dir / "runs/split/metrics.jsonl"))
    if (m.contains("loss")) by_step[m["step"].get<int64_t>()] = m["loss"].get<double>();
  for (const auto& [step, loss] : by_step) split.push_back(loss);
  CHECK(split == whole);
  CHECK(first_skip > 30);  // decided after the resume, by the window the checkpoint kept
}

TEST_CASE("guard skip gives up after max_skips skipped updates in a row, and stops", "[guard]") {
  TempDir ws("guard");
  write_file(ws.dir / "run.yaml",
             diverging_config("{action: skip, spike_zscore: 4, window: 10, spike_steps: 2, max_skips: 2}"));
  const CommandResult r = run_ptrain("train run.yaml", ws.dir);
  INFO(r.output);
  CHECK(r.exit_code == 4);
  CHECK(count_of(r.output, "its update skipped") == 2);
  CHECK(r.output.find("and 2 updates in a row were skipped (training.guard.max_skips)") != std::string::npos);
  // The same run without the cap skips its first two at the same steps: the stop is the second's.
  int64_t last_skip = 0;
  for (const auto& m : read_metrics(ws.dir / "runs/div/metrics.jsonl"))
    if (m.contains("guard") && m["guard"] == "skip") last_skip = m["step"].get<int64_t>();
  CHECK(r.output.find("at step " + std::to_string(last_skip) + ":") != std::string::npos);
}

TEST_CASE("a guard that never fires changes nothing: bit-identical losses", "[guard]") {
  TempDir ws("guard");
  // lr 1e-3: a sane run, which the guard watches with a tight threshold and never stops.
  std::string sane = diverging_config("{action: skip, spike_zscore: 50, window: 5, spike_steps: 1}");
  sane.replace(sane.find("lr: 1.0"), 7, "lr: 1e-3");
  write_file(ws.dir / "watched.yaml", sane);
  std::string plain = diverging_config("{action: stop}");
  plain.replace(plain.find("lr: 1.0"), 7, "lr: 1e-3");
  write_file(ws.dir / "plain.yaml", plain);
  REQUIRE(run_ptrain("train watched.yaml --set run.name=watched", ws.dir).exit_code == 0);
  REQUIRE(run_ptrain("train plain.yaml --set run.name=plain", ws.dir).exit_code == 0);
  const std::vector<double> a = losses(ws.dir / "runs/watched/metrics.jsonl"), b = losses(ws.dir / "runs/plain/metrics.jsonl");
  REQUIRE(a.size() == 40);
  CHECK(a == b);
  CHECK(nlohmann::json::parse(read_file(ws.dir / "runs/watched/summary.json"))["guard_skipped_steps"] == 0);
}

}  // namespace
}  // namespace ptrain::test
