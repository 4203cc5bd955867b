// Weight-only INT8 (precision/int8_weights.h): the quantizer against its definition, and what it
// costs a trained model through `ptrain eval --weights int8` and `ptrain sample --weights int8`.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "precision/int8_weights.h"
#include "test_util.h"

namespace ptrain::test {
namespace {

namespace fs = std::filesystem;

TEST_CASE("the INT8 quantizer: a scale per output channel, codes rounded to nearest with ties to even",
          "[int8]") {
  const std::vector<float> w = {
      127, 2.5f, 3.5f, -2.5f, -3.5f, 0.4f, -127,  // amax 127: scale 1, so the codes are the values rounded
      254, 5, 7, 1, -0.9f, 0, 0,                  // amax 254: scale 2; 5/2 = 2.5 and 7/2 = 3.5 are ties
      0, 0, 0, 0, 0, 0, 0,                        // all zero: scale 0, codes 0
      -8, 1, 2, 3, 5, 6, 7,                       // the largest magnitude negative: -127, not -128
  };
  const Int8Rows q = quantize_int8_rows(w.data(), 4, 7);
  REQUIRE(q.scales.size() == 4);
  CHECK(q.scales[0] == 1.0f);
  CHECK(q.scales[1] == 2.0f);
  CHECK(q.scales[2] == 0.0f);
  CHECK(q.scales[3] == 8.0f / 127.0f);
  const std::vector<int8_t> expected = {127, 2,    4, -2, -4, 0, -127,  //
                                        127, 2,    4, 0,  0,  0, 0,     // 0.5 -> 0, -0.45 -> 0
                                        0,   0,    0, 0,  0,  0, 0,     //
                                        -127, 16, 32, 48, 79, 95, 111};  // k x 127/8: 15.875, 31.75, 47.625, 79.375, ...
  CHECK(q.codes == expected);
  std::vector<float> back(w.size());
  dequantize_int8_rows(q, back.data());
  for (size_t i = 0; i < w.size(); ++i) CHECK(back[i] == static_cast<float>(q.codes[i]) * q.scales[i / 7]);

  // Random rows: every code is round-to-nearest of w / scale, within half a step of the weight.
  std::vector<float> r(64 * 96);
  fill_normal(r, 11, 0.02);
  const Int8Rows rq = quantize_int8_rows(r.data(), 64, 96);
  std::vector<float> rback(r.size());
  dequantize_int8_rows(rq, rback.data());
  for (int64_t row = 0; row < 64; ++row) {
    float amax = 0;
    int largest_code = 0;
    for (int64_t c = 0; c < 96; ++c) amax = std::max(amax, std::fabs(r[row * 96 + c]));
    const float scale = rq.scales[row];
    REQUIRE(scale == amax / 127.0f);
    for (int64_t c = 0; c < 96; ++c) {
      const size_t i = static_cast<size_t>(row * 96 + c);
      CHECK(rq.codes[i] == static_cast<int8_t>(std::nearbyint(r[i] / scale)));
      CHECK(std::fabs(rback[i] - r[i]) <= 0.5f * scale * (1 + 1e-5f));
      largest_code = std::max(largest_code, std::abs(static_cast<int>(rq.codes[i])));
    }
    CHECK(largest_code == 127);  // the row's largest weight maps to the end of the range
  }
}

// "label val_loss X" in eval's output: X.
double loss_after(const std::string& output, const std::string& label) {
  const size_t at = output.find(label + "val_loss ");
  REQUIRE(at != std::string::npos);
  return std::stod(output.substr(at + label.size() + 9));
}

TEST_CASE("INT8 weights: a small trained model's val loss within 1% of its fp32 loss, the checkpoint untouched",
          "[int8]") {
  TempDir ws("int8");
  write_file(ws.dir / "run.yaml",
             "run: {name: r, out_dir: runs, seed: 5, device: cpu}\n"
             "model: {n_layer: 2, n_head: 4, n_embd: 64, seq_len: 32, vocab_size: 256}\n"
             "data: {synthetic: {vocab: 256, order: 2, branching: 4, tokens: 80000, seed: 9}}\n"
             "training: {steps: 60, batch_tokens: 512, micro_batch: 16, eval_every: 60, eval_batches: 4, threads: 1}\n"
             "optimizer: {lr: 3.0e-3}\n");
  const CommandResult trained = run_ptrain("train run.yaml", ws.dir);
  INFO(trained.output);
  REQUIRE(trained.exit_code == 0);
  const std::string ck = "runs/r/checkpoints/step_00000060";
  const std::string weights_before = read_file(ws.dir / ck / "weights.safetensors");

  const CommandResult eval = run_ptrain("eval run.yaml --checkpoint " + ck + " --weights int8", ws.dir);
  INFO(eval.output);
  REQUIRE(eval.exit_code == 0);
  const double fp32 = loss_after(eval.output, "): "), int8 = loss_after(eval.output, "int8 weights: ");
  CHECK(fp32 < std::log(256.0) - 1.0);  // the model learned something for INT8 to cost
  CHECK(int8 != fp32);                  // the weights did change
  CHECK(std::fabs(int8 - fp32) / fp32 < 0.01);
  char diff[64];
  std::snprintf(diff, sizeof diff, "%+.6f", int8 - fp32);
  CHECK(eval.output.find(diff) != std::string::npos);
  CHECK(eval.output.find("(the block linears) in INT8, per output channel") != std::string::npos);
  CHECK(read_file(ws.dir / ck / "weights.safetensors") == weights_before);

  // Without --weights, eval is unchanged: the fp32 loss only.
  const CommandResult plain = run_ptrain("eval run.yaml --checkpoint " + ck, ws.dir);
  CHECK(plain.output.find("int8") == std::string::npos);
  CHECK(loss_after(plain.output, "): ") == fp32);

  // sample with INT8 weights: deterministic for a seed; a bad --weights is refused.
  const std::string sample = "sample --checkpoint " + ck + " --prompt \"1 2 3\" --tokens 30 --seed 4 --weights int8";
  const CommandResult a = run_ptrain(sample, ws.dir), b = run_ptrain(sample, ws.dir);
  INFO(a.output);
  REQUIRE(a.exit_code == 0);
  CHECK(a.output == b.output);
  for (const char* command : {"eval run.yaml --checkpoint ", "sample --checkpoint "}) {
    const CommandResult bad = run_ptrain(std::string(command) + ck + " --weights int4", ws.dir);
    INFO(bad.output);
    CHECK(bad.exit_code == 2);
    CHECK(bad.output.find("--weights: \"int4\"; expected fp32") != std::string::npos);
  }
}

}  // namespace
}  // namespace ptrain::test
