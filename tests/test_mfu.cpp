// MFU: the GPU peak table keyed by device properties, the precision mix's peak, and a CPU run's
// model FLOP/s and MFU against the cached sgemm rate, as the step records and summary carry them.
#include <catch2/catch.hpp>

#include <string>

#include "metrics/device_peak.h"
#include "test_util.h"
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
  const double per_token = training_flops_per_token(model, 16);
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

  // The next run reads the cache; another thread count is another entry.
  const CommandResult again = run_ptrain("train run.yaml --set run.overwrite=true", ws.dir, cache);
  CHECK(again.output.find("measured earlier") != std::string::npos);
  const CommandResult two = run_ptrain("train run.yaml --set run.overwrite=true --set training.threads=2", ws.dir, cache);
  INFO(two.output);
  CHECK(two.output.find("measured now") != std::string::npos);
  CHECK(nlohmann::json::parse(read_file(ws.dir / "cache/cpu-peak.json")).size() == 2);
}

}  // namespace
}  // namespace ptrain::test
