// The whole GPT: every parameter's gradient against central finite differences (in float64,
// through the same model code and backend templates that train in float32), and the loss at
// initialisation.
#include <catch2/catch.hpp>

#include "backend/backend.h"
#include "model/transformer.h"
#include "precision/policy.h"
#include "test_util.h"

using namespace ptrain;
using namespace ptrain::test;

namespace {

std::vector<int32_t> random_tokens(size_t n, int vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(vocab)));
  return t;
}

void check_gradients(const ModelShape& shape) {
  auto backend = make_cpu_backend(0);
  const int B = 2, T = 5;
  Transformer model(shape, *backend, DType::f64, B, T);
  model.init(42);
  // Larger weights than GPT-2's 0.02 make every term of the gradient visible above rounding.
  double* p = model.params_flat().as<double>();
  Rng rng(7);
  for (int64_t i = 0; i < model.num_params(); ++i) p[i] += 0.3 * rng.normal();
  // Keep the padded vocabulary rows at zero, as training does.
  for (const ParamId id : {kWte, kLmHead}) {
    const Tensor t = model.param(id);
    if (t.empty()) continue;
    for (int64_t i = int64_t{shape.vocab} * shape.n_embd; i < t.numel(); ++i) t.as<double>()[i] = 0;
  }

  const auto inputs = random_tokens(B * T, shape.vocab, 1);
  const auto targets = random_tokens(B * T, shape.vocab, 2);
  model.zero_grad();
  model.forward(inputs.data(), targets.data(), 1.0f / (B * T));
  model.backward();

  const double eps = 1e-5;
  for (const ParamSpec& spec : model.specs()) {
    const Tensor param = model.param(spec.id);
    const Tensor grad = model.grad(spec.id);
    CAPTURE(spec.name);
    std::vector<double> numeric(param.numel()), analytic(grad.as<double>(), grad.as<double>() + grad.numel());
    for (int64_t i = 0; i < param.numel(); ++i) {
      double& x = param.as<double>()[i];
      const double saved = x;
      x = saved + eps;
      const double up = model.forward(inputs.data(), targets.data(), 0.0f);
      x = saved - eps;
      const double down = model.forward(inputs.data(), targets.data(), 0.0f);
      x = saved;
      numeric[i] = (up - down) / (2 * eps);
    }
    REQUIRE(norm(numeric) > 0);
    CHECK(relative_error(analytic, numeric) < 1e-6);
  }
}

}  // namespace

TEST_CASE("every parameter's gradient matches finite differences", "[model]") {
  const ModelShape gpt2{2, 2, 8, 7, 11, 128};  // L, NH, C, max T, V, Vp
  SECTION("gpt2") { check_gradients(gpt2); }
  // Head sizes 2 and 6; K/V heads 1 (multi-query), 2 of 4 (grouped) and all 4 (multi-head).
  SECTION("llama, grouped-query attention 4:2, untied head") { check_gradients(llama_shape({2, 4, 24, 7, 11, 128}, 2, 20)); }
  SECTION("llama, one K/V head, head size 2, tied head") { check_gradients(llama_shape({1, 4, 8, 7, 11, 128}, 1, 12, true)); }
  SECTION("llama, multi-head attention") { check_gradients(llama_shape({1, 4, 24, 7, 11, 128}, 4, 16)); }
  SECTION("llama, QK-norm, grouped-query attention 4:2") {
    check_gradients(with_qk_norm(llama_shape({2, 4, 24, 7, 11, 128}, 2, 20)));
  }
}

// training.recompute trades memory for a second forward pass; the recomputed activations are
// the first pass's bits, so the loss and every gradient must be too, in every format.
TEST_CASE("activation recomputation gives the same loss and gradients bit for bit, in less memory", "[model]") {
  auto backend = make_cpu_backend(0);
  const ModelShape gpt2{3, 4, 64, 16, 50, 128};
  const ModelShape shape =
      GENERATE_COPY(values<ModelShape>({gpt2, llama_shape(gpt2, 2, 96), with_qk_norm(llama_shape(gpt2, 2, 96))}));
  const char* mode = GENERATE("fp32", "bf16", "fp8");
  INFO(choice_name(shape.arch) << (shape.qk_norm ? " QK-norm " : " ") << mode);
  PrecisionPolicy policy;
  if (std::string(mode) != "fp32") {
    PrecisionConfig config;
    config.mode = *parse_choice<PrecisionMode>(mode);
    policy = PrecisionPolicy::from_config(config);
  }
  const int B = 2, T = 16;
  const auto inputs = random_tokens(B * T, shape.vocab, 21), targets = random_tokens(B * T, shape.vocab, 22);
  std::vector<double> losses;
  std::vector<std::vector<float>> grads;
  std::vector<size_t> bytes;
  // FP8 throughout the run: the inputs its layers read backward as codes take one layer's room
  // too (below what each recompute setting keeps, but under a recomputed block, which already
  // keeps one layer of them), and every layer's backward pass reads the right ones.
  const bool fp8 = std::string(mode) == "fp8";
  for (const bool fp8_throughout : fp8 ? std::vector<bool>{false, true} : std::vector<bool>{false})
    for (const Recompute recompute : {Recompute::none, Recompute::mlp, Recompute::block}) {
      Transformer model(shape, *backend, DType::f32, B, T, policy, AttentionPath::fallback, true, recompute, {},
                        fp8_throughout);
      model.init(5);
      model.zero_grad();
      losses.push_back(model.forward(inputs.data(), targets.data(), 1.0f / (B * T)));
      model.backward();
      const Tensor g = model.grads_flat();
      grads.emplace_back(g.as<float>(), g.as<float>() + g.numel());
      bytes.push_back(model.activation_bytes());
      CHECK(bytes.back() == static_cast<size_t>(model_activation_bytes(shape, B, T, sizeof(float), recompute,
                                                                       fp8_throughout)));
    }
  CHECK(norm(grads[0]) > 0);
  for (size_t i = 1; i < losses.size(); ++i) {
    CAPTURE(i);
    CHECK(losses[i] == losses[0]);
    CHECK(grads[i] == grads[0]);
  }
  CHECK(bytes[1] < bytes[0]);
  CHECK(bytes[2] < bytes[1]);
  if (fp8) {
    CHECK(bytes[3] < bytes[0]);
    CHECK(bytes[4] < bytes[1]);
    CHECK(bytes[5] == bytes[2]);
  }
  CHECK(model_activation_bytes(shape, B, T, sizeof(float), Recompute::block) < model_activation_bytes(shape, B, T, sizeof(float)));
}

TEST_CASE("padded vocabulary rows get no gradient", "[model]") {
  auto backend = make_cpu_backend(0);
  const ModelShape shape{1, 2, 16, 8, 50, 128};
  Transformer model(shape, *backend, DType::f32, 2, 8);
  model.init(3);
  const auto inputs = random_tokens(16, shape.vocab, 4), targets = random_tokens(16, shape.vocab, 5);
  model.zero_grad();
  model.forward(inputs.data(), targets.data(), 1.0f / 16);
  model.backward();
  const float* dwte = model.grad(kWte).as<float>();
  for (int64_t i = int64_t{shape.vocab} * shape.n_embd; i < int64_t{shape.padded_vocab} * shape.n_embd; ++i)
    REQUIRE(dwte[i] == 0.0f);
}

TEST_CASE("loss at initialisation is close to ln(vocab)", "[model]") {
  auto backend = make_cpu_backend(0);
  for (int vocab : {256, 1000}) {
    CAPTURE(vocab);
    const ModelShape gpt2{2, 4, 64, 64, vocab, (vocab + 127) / 128 * 128};
    for (const ModelShape& shape : {gpt2, llama_shape(gpt2, 2, 176)}) {
      CAPTURE(choice_name(shape.arch));
      Transformer model(shape, *backend, DType::f32, 4, 64);
      model.init(1337);
      const auto inputs = random_tokens(4 * 64, vocab, 6), targets = random_tokens(4 * 64, vocab, 7);
      const double loss = model.forward(inputs.data(), targets.data(), 0.0f);
      CHECK(std::abs(loss - std::log(vocab)) < 0.05);
    }
  }
}

// model.fused_gelu hands the MLP's GELU to Backend::matmul_gelu_forward/backward; the CPU runs
// them as the separate ops, so both settings give the same loss and gradients bit for bit (the
// finite-difference test above checks the fused calls' gradients in float64).
TEST_CASE("the MLP through matmul_gelu_forward/backward equals the separate ops on the CPU", "[model]") {
  auto backend = make_cpu_backend(0);
  const ModelShape shape{2, 2, 32, 16, 64, 128};
  const auto inputs = random_tokens(2 * 16, shape.vocab, 8), targets = random_tokens(2 * 16, shape.vocab, 9);
  std::vector<std::vector<float>> grads;
  std::vector<double> losses;
  for (const bool fused : {true, false}) {
    Transformer model(shape, *backend, DType::f32, 2, 16, PrecisionPolicy{}, AttentionPath::fallback, fused);
    model.init(11);
    model.zero_grad();
    losses.push_back(model.forward(inputs.data(), targets.data(), 1.0f / 32));
    model.backward();
    const Tensor g = model.grads_flat();
    grads.emplace_back(g.as<float>(), g.as<float>() + g.numel());
  }
  CHECK(losses[0] == losses[1]);
  CHECK(grads[0] == grads[1]);
  CHECK(norm(grads[0]) > 0);
}

TEST_CASE("parameter count matches GPT-2 124M", "[model]") {
  // llm.c counts 124,475,904 parameters for GPT-2 small with the vocabulary padded to 50304.
  const ModelShape gpt2{12, 12, 768, 1024, 50257, 50304};
  CHECK(param_count(gpt2) == 124475904);
}

// Data-parallel runs sum each block's gradients as soon as the backward pass has finished it:
// the callback must see the head (L: the final norm), blocks L-1 .. 0, then the embeddings,
// each bucket's gradients already final, and the sums over micro-batches must be those of a
// backward pass without it.
TEST_CASE("backward reports each block's finished gradients, which equal a plain backward's", "[model]") {
  auto backend = make_cpu_backend(1);
  const ModelShape shape{3, 2, 16, 8, 50, 128};
  const int B = 2, T = 8;
  for (const char* mode : {"fp32", "bf16"}) {
    CAPTURE(mode);
    PrecisionConfig pc;
    pc.mode = *parse_choice<PrecisionMode>(mode);
    const PrecisionPolicy policy = PrecisionPolicy::from_config(pc);
    Transformer plain(shape, *backend, DType::f32, B, T, policy), hooked(shape, *backend, DType::f32, B, T, policy);
    plain.init(9);
    hooked.init(9);
    plain.zero_grad();
    hooked.zero_grad();
    std::vector<int> order;
    std::vector<std::vector<float>> reported;  // each block's gradients when reported
    for (int micro = 0; micro < 2; ++micro) {  // two micro-batches: the sums accumulate
      const auto inputs = random_tokens(B * T, shape.vocab, 20 + micro), targets = random_tokens(B * T, shape.vocab, 30 + micro);
      plain.forward(inputs.data(), targets.data(), 0.25f / (B * T));
      plain.backward();
      hooked.forward(inputs.data(), targets.data(), 0.25f / (B * T));
      if (micro == 0) {
        hooked.backward();
        continue;
      }
      hooked.backward([&](int block) {
        order.push_back(block);
        std::vector<float> values;
        for (const Tensor& g : hooked.block_grads(block)) values.insert(values.end(), g.as<float>(), g.as<float>() + g.numel());
        reported.push_back(values);
      });
    }
    CHECK(order == std::vector<int>{3, 2, 1, 0, -1});
    for (size_t k = 0; k < order.size(); ++k) {  // what was reported is what the plain pass ends with
      std::vector<float> want;
      for (const Tensor& g : plain.block_grads(order[k])) want.insert(want.end(), g.as<float>(), g.as<float>() + g.numel());
      CHECK(reported[k] == want);
    }
  }
}

TEST_CASE("a token id outside the vocabulary is refused before the model reads it", "[model]") {
  auto backend = make_cpu_backend(0);
  const ModelShape shape{1, 2, 8, 7, 11, 128};
  const int B = 2, T = 5;
  Transformer model(shape, *backend, DType::f32, B, T);
  model.init(1);
  auto inputs = random_tokens(B * T, shape.vocab, 1);
  auto targets = random_tokens(B * T, shape.vocab, 2);
  inputs[7] = shape.vocab;
  CHECK_THROWS_WITH(model.forward(inputs.data(), targets.data(), 0.0f),
                    Catch::Contains("input token id 11 at position 7") && Catch::Contains("[0, 11)"));
  inputs[7] = 0;
  targets[3] = -2;
  double loss_sum = 0;
  CHECK_THROWS_WITH(model.train_micro_batch(inputs.data(), targets.data(), 0.1f, Tensor(&loss_sum, DType::f64, {1})),
                    Catch::Contains("target token id -2 at position 3"));
}

// The KV cache: each decoded position's logits are the whole forward pass's at that position,
// in double to rounding and in float as close as summation orders allow, for a micro-batch of
// two (only sequence 0 decodes).
TEST_CASE("KV-cache decoding gives the whole forward pass's logits at every position", "[model][sample]") {
  auto backend = make_cpu_backend(0);
  const ModelShape gpt2{2, 2, 16, 24, 50, 64};  // L, NH, C, max T, V, Vp
  // Llama: RoPE turns each decoded row by its own position's angles, over 4 query heads on 2 K/V heads.
  const ModelShape llama = llama_shape({2, 4, 16, 24, 50, 64}, 2, 40);
  const ModelShape shape = GENERATE_COPY(values<ModelShape>({gpt2, llama, with_qk_norm(llama)}));
  const int B = 2, T = 24;
  const auto tokens = random_tokens(T, shape.vocab, 3);
  for (const DType dt : {DType::f64, DType::f32}) {
    INFO(choice_name(shape.arch) << (dt == DType::f64 ? " f64" : " f32"));
    Transformer decoding(shape, *backend, dt, B, T), whole(shape, *backend, dt, B, T);
    decoding.init(4, 0.2);  // larger than GPT-2's 0.02: logits far from uniform
    whole.init(4, 0.2);
    std::vector<float> logits = decoding.start_decoding(tokens.data(), 3);
    for (int length = 3; length <= T; ++length) {
      INFO("position " << length - 1);
      REQUIRE(decoding.decoded_length() == length);
      CHECK(relative_error(logits, whole.start_decoding(tokens.data(), length)) < (dt == DType::f64 ? 1e-6 : 1e-5));
      if (length < T) logits = decoding.decode_next(tokens[static_cast<size_t>(length)]);
    }
    CHECK_THROWS(decoding.decode_next(0));  // the context is full
  }
}

TEST_CASE("a training forward pass ends the decoding, and decoded ids are checked", "[model][sample]") {
  auto backend = make_cpu_backend(0);
  const ModelShape shape{1, 2, 8, 8, 11, 16};
  Transformer model(shape, *backend, DType::f32, 1, 8);
  model.init(1);
  const auto tokens = random_tokens(8, shape.vocab, 5);
  model.start_decoding(tokens.data(), 2);
  CHECK_THROWS_WITH(model.decode_next(11), Catch::Contains("token id 11"));
  model.forward(tokens.data(), tokens.data(), 0.0f);
  CHECK(model.decoded_length() == 0);
  CHECK_THROWS(model.decode_next(1));
}
