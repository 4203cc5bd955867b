// MFU: the GPU peak table keyed by device properties, the precision mix's peak, and a CPU run's
// model FLOP/s and MFU against the cached sgemm rate, as the step records and summary carry them;
// a cached rate below what a run achieves is measured again, and no utilisation above 100% is
// printed as a fact.
#include <catch2/catch.hpp>

#include <regex>
#include <string>

#include "metrics/cpu_peak.h"
#include "metrics/device_peak.h"
#include "test_util.h"
#include "train/run_spec.h"
#include "train/trainer.h"

namespace ptrain::test {
namespace {

namespace fs = std::filesystem;

CudaDeviceInfo device(const std::string& name, int major, int minor, int sms, double gb) {
  return {0, name, major, minor, sms, static_cast<size_t>(gb * 1e9)};
}

TEST_CASE("the GPU peak table names each Hopper part by its properties, and no other GPU", "[mfu]") {
  struct Case {
    CudaDeviceInfo device;
    const char* part;
    double bf16_tflops, fp8_tflops;
  };
  // Memory as the parts report it: 80 GB (about 85e9 bytes), 94 GB, 141 GB.
  for (const Case& c : {Case{device("NVIDIA H100 80GB HBM3", 9, 0, 132, 85.0), "H100 SXM", 989.4, 1978.9},
                        Case{device("NVIDIA H100 PCIe", 9, 0, 114, 85.0), "H100 PCIe", 756.0, 1513.0},
                        Case{device("NVIDIA H100 NVL", 9, 0, 132, 99.9), "H100 NVL", 835.5, 1670.5},
                        Case{device("NVIDIA H200", 9, 0, 132, 150.0), "H200 SXM", 989.4, 1978.9},
                        Case{device("NVIDIA H200 NVL", 9, 0, 132, 150.0), "H200 NVL", 835.5, 1670.5}}) {
    INFO(c.device.name);
    const PeakLookup found = lookup_device_peaks(c.device);
    REQUIRE(found.device);
    CHECK(found.device->part == c.part);
    CHECK(found.device->peaks.bf16 == Approx(c.bf16_tflops * 1e12));
    CHECK(found.device->peaks.fp8 == Approx(c.fp8_tflops * 1e12));
    CHECK(found.device->source.find("data sheet") != std::string::npos);
  }
  // Not targeted by this build (sm_90a), or a Hopper part not in the table: said, no figure.
  const PeakLookup a100 = lookup_device_peaks(device("NVIDIA A100-SXM4-80GB", 8, 0, 108, 85.0));
  CHECK(!a100.device);
  CHECK(a100.why_none.find("targets sm_90a") != std::string::npos);
  CHECK(a100.why_none.find("compute capability 8.0") != std::string::npos);
  const PeakLookup gh200 = lookup_device_peaks(device("NVIDIA GH200 480GB", 9, 0, 132, 102.0));
  CHECK(!gh200.device);
  CHECK(gh200.why_none.find("not in ptrain's table") != std::string::npos);
}

TEST_CASE("the precision mix's peak weighs each GEMM's FLOPs by its own precision's peak", "[mfu]") {
  CHECK(mixed_peak(0, 2e15, 1e15) == 1e15);
  CHECK(mixed_peak(1, 2e15, 1e15) == Approx(2e15));
  // Half the FLOPs at twice the rate: the time is 3/4 of the other's, the peak 4/3 of it.
  CHECK(mixed_peak(0.5, 2e15, 1e15) == Approx(4e15 / 3));
}

TEST_CASE("a CPU run logs model FLOP/s and MFU against the sgemm rate it measured once and cached", "[mfu]") {
  TempDir ws("mfu");
  write_file(ws.dir / "run.yaml",
             "run: {name: r, out_dir: runs, seed: 1, device: cpu}\n"
             "model: {n_layer: 1, n_head: 2, n_embd: 32, seq_len: 16, vocab_size: 64}\n"
             "data: {synthetic: {vocab: 64, order: 1, branching: 4, tokens: 20000, seed: 2}}\n"
             "training: {steps: 3, batch_tokens: 64, micro_batch: 4, eval_every: 0, threads: 1}\n"
             "checkpoint: {save_final: false}\n");
  const std::string cache = "PTRAIN_CACHE='" + (ws.dir / "cache").string() + "'";
  const CommandResult first = run_ptrain("train run.yaml", ws.dir, cache);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  CHECK(first.output.find("against this CPU's sgemm rate") != std::string::npos);
  CHECK(first.output.find("measured now") != std::string::npos);
  CHECK(first.output.find("a CPU has no BF16 peak") != std::string::npos);
  const nlohmann::json peaks = nlohmann::json::parse(read_file(ws.dir / "cache/cpu-peak.json"));
  REQUIRE(peaks.size() == 1);
  CHECK(peaks.begin().key().find("| 1 threads |") != std::string::npos);

  const nlohmann::json summary = nlohmann::json::parse(read_file(ws.dir / "runs/r/summary.json"));
  const double peak = summary["peak_mix_flops"].get<double>();
  CHECK(peak == peaks.begin().value().get<double>());
  CHECK(summary["peak_bf16_flops"].is_null());
  CHECK(summary["mfu"].is_null());
  ModelConfig model;
  model.n_layer = 1;
  model.n_head = 2;
  model.n_embd = 32;
  model.seq_len = 16;
  model.vocab_size = 64;
  const double per_token = training_flops_per_token(ModelShape::of(model), 16);
  int steps = 0;
  for (const auto& rec : read_metrics(ws.dir / "runs/r/metrics.jsonl")) {
    if (!rec.contains("loss")) continue;
    ++steps;
    CAPTURE(rec.dump());
    const double flops = rec["model_flops_per_s"].get<double>();
    CHECK(flops == Approx(per_token * rec["tokens_per_s"].get<double>()).epsilon(1e-12));
    CHECK(rec["mfu"].is_null());  // no BF16 peak on a CPU
    CHECK(rec["mfu_mix"].get<double>() == Approx(flops / peak).epsilon(1e-12));
  }
  CHECK(steps == 3);

  // The next run reads the cache; another thread count is another entry, unless its figure fell
  // below one thread's (the machine was busy): then it is not cached, and the log says so.
  const CommandResult again = run_ptrain("train run.yaml --set run.overwrite=true", ws.dir, cache);
  CHECK(again.output.find("measured earlier") != std::string::npos);
  const CommandResult two = run_ptrain("train run.yaml --set run.overwrite=true --set training.threads=2", ws.dir, cache);
  INFO(two.output);
  CHECK(two.output.find("measured now") != std::string::npos);
  const bool busy = two.output.find("the machine was busy, so the 1-thread rate stands in and is not cached") !=
                    std::string::npos;
  CHECK(nlohmann::json::parse(read_file(ws.dir / "cache/cpu-peak.json")).size() == (busy ? 1u : 2u));
}

TEST_CASE("utilisations above 100% say the ceiling is stale", "[mfu]") {
  CHECK(format_utilisation(0.873) == "87.3%");
  CHECK(format_utilisation(1.0) == "100.0%");
  CHECK(format_utilisation(1.773) == "177.3% (above 100%: the ceiling is stale)");
}

TEST_CASE("a cached sgemm ceiling below what a run achieves is measured again, and never quoted above 100% as a "
          "fact",
          "[mfu]") {
  TempDir ws("mfu");
  write_file(ws.dir / "run.yaml",
             "run: {name: r, out_dir: runs, seed: 1, device: cpu}\n"
             "model: {n_layer: 1, n_head: 2, n_embd: 32, seq_len: 16, vocab_size: 64}\n"
             "data: {synthetic: {vocab: 64, order: 1, branching: 4, tokens: 20000, seed: 2}}\n"
             "training: {steps: 4, batch_tokens: 64, micro_batch: 4, eval_every: 0, threads: 1}\n"
             "checkpoint: {save_final: false}\n");
  const std::string cache = "PTRAIN_CACHE='" + (ws.dir / "cache").string() + "'";
  REQUIRE(run_ptrain("train run.yaml", ws.dir, cache).exit_code == 0);
  // A stale cache, by construction: this machine's entry says 1 MFLOP/s, which any run exceeds.
  nlohmann::json peaks = nlohmann::json::parse(read_file(ws.dir / "cache/cpu-peak.json"));
  REQUIRE(peaks.size() == 1);
  const std::string key = peaks.begin().key();
  peaks[key] = 1e6;
  write_file(ws.dir / "cache/cpu-peak.json", peaks.dump());
  const CommandResult r = run_ptrain("train run.yaml --set run.overwrite=true", ws.dir, cache);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("exceed the sgemm ceiling of 0.0 GFLOP/s (best of 5 sgemms of 1024^3, measured earlier") !=
        std::string::npos);
  CHECK(count_of(r.output, "; measured again: ") == 1);  // once per run
  const double remeasured = nlohmann::json::parse(read_file(ws.dir / "cache/cpu-peak.json"))[key].get<double>();
  CHECK(remeasured > 1e6);
  // Every step's MFU is quoted against the new figure; any that still tops it says so.
  const std::regex mfu(R"(MFU ([0-9.]+)%([^|\n]*))");
  int quoted = 0;
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), mfu); it != std::sregex_iterator(); ++it) {
    ++quoted;
    if (std::stod((*it)[1].str()) > 100) CHECK((*it)[2].str().find("(above 100%: the ceiling is stale)") != std::string::npos);
  }
  CHECK(quoted == 4);
  const nlohmann::json summary = nlohmann::json::parse(read_file(ws.dir / "runs/r/summary.json"));
  CHECK(summary["peak_mix_flops"].get<double>() == remeasured);
}

}  // namespace
}  // namespace ptrain::test
