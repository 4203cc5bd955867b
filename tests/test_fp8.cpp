// The FP8 path piece by piece: casts against round(x * scale) / scale with exact counts, a
// linear layer against a hand-quantised reference, the weight cast once per step, the delayed
// history fed once per micro-batch, native casts whose statistics are read once per step, and
// which layers a policy puts in FP8.
#include <catch2/catch.hpp>

#include <array>
#include <cstring>

#include "backend/backend.h"
#include "model/fp8_linear.h"
#include "model/transformer.h"
#include "test_backends.h"
#include "test_util.h"

using namespace ptrain;
using namespace ptrain::test;

namespace {

// Per-tensor fake quantisation as the reference: round(x * scale) to the format, times 1/scale.
std::vector<double> quantise(const std::vector<float>& x, Format f, float scale) {
  std::vector<double> q(x.size());
  for (size_t i = 0; i < x.size(); ++i) q[i] = round_to_format(x[i] * scale, f, true) * (1.0f / scale);
  return q;
}

float amax_of(const std::vector<float>& x) {
  float m = 0;
  for (float v : x) m = std::max(m, std::fabs(v));
  return m;
}

Fp8Policy policy(Fp8Recipe recipe) {
  Fp8Policy p;
  p.enabled = true;
  p.recipe = recipe;
  return p;
}

}  // namespace

TEST_CASE("an fp8 cast equals round(x times scale) over scale and counts exactly", "[fp8]") {
  // 1e-6 underflows at scale 1; 500 and -1000 saturate E4M3 (max 448); 450 merely rounds down
  // to 448 (round to nearest, no clipping); 0 is not counted.
  HostBuffer<float> x({7}), out({7}, NAN);
  x.data = {1.0f, 1e-6f, 500.0f, -1000.0f, 0.0f, 3.3f, 450.0f};
  const Fp8CastStats s = cpu_backend().fp8_cast(out.view(), x.view(), Format::e4m3, 1.0f);
  CHECK(out.data == std::vector<float>({1.0f, 0.0f, 448.0f, -448.0f, 0.0f, 3.25f, 448.0f}));
  CHECK(s.amax == 1000.0f);
  CHECK(s.nonzero == 6);
  CHECK(s.underflow == 1);
  CHECK(s.saturated == 2);

  HostBuffer<float> y({1000}), q({1000});
  fill_normal(y.data, 41, 3.0);
  for (Format f : {Format::e4m3, Format::e5m2}) {
    const float scale = 37.5f;
    cpu_backend().fp8_cast(q.view(), y.view(), f, scale);
    CHECK(std::vector<double>(q.data.begin(), q.data.end()) == quantise(y.data, f, scale));
  }
}

TEST_CASE("block casts scale each tile by its own amax", "[fp8]") {
  const int rows = 3, cols = 256;
  HostBuffer<float> x({rows, cols}), out({rows, cols});
  fill_normal(x.data, 42);
  for (int c = 128; c < 256; ++c) x.data[c] *= 1000.0f;  // row 0, second tile: large values
  cpu_backend().fp8_cast_blocks(out.view(), x.view(), Format::e4m3, 1, 128);
  for (int r = 0; r < rows; ++r)
    for (int t = 0; t < 2; ++t) {
      std::vector<float> tile(x.data.begin() + r * cols + t * 128, x.data.begin() + r * cols + t * 128 + 128);
      const auto ref = quantise(tile, Format::e4m3, current_scale(amax_of(tile), 448.0f));
      for (int i = 0; i < 128; ++i) REQUIRE(out.data[r * cols + t * 128 + i] == static_cast<float>(ref[i]));
    }
}

TEST_CASE("an fp8 linear layer matches a hand-quantised reference", "[fp8]") {
  const int N = 19, C = 32, OC = 48;
  HostBuffer<float> inp({N, C}), w({OC, C}), bias({OC}), out({N, OC}), dout({N, OC});
  fill_normal(inp.data, 43);
  fill_normal(w.data, 44, 0.1);
  fill_normal(bias.data, 45);
  fill_normal(dout.data, 46, 1e-3);

  Fp8Linear layer("test", policy(Fp8Recipe::current), cpu_backend(), N, C, OC);
  layer.forward(out.view(), inp.view(), w.view(), bias.view(), true);
  const auto qi = quantise(inp.data, Format::e4m3, current_scale(amax_of(inp.data), 448.0f));
  const auto qw = quantise(w.data, Format::e4m3, current_scale(amax_of(w.data), 448.0f));
  const auto qg = quantise(dout.data, Format::e5m2, current_scale(amax_of(dout.data), 57344.0f));
  std::vector<double> ref(N * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = bias.data[o];
      for (int c = 0; c < C; ++c) s += qi[n * C + c] * qw[o * C + c];
      ref[n * OC + o] = s;
    }
  CHECK(relative_error(out.data, ref) < 1e-5);

  HostBuffer<float> dinp({N, C}), dw({OC, C}), db({OC});
  layer.backward(dinp.view(), dw.view(), db.view(), dout.view(), w.view());
  std::vector<double> rdinp(N * C, 0.0), rdw(OC * C, 0.0), rdb(OC, 0.0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      rdb[o] += dout.data[n * OC + o];  // the bias gradient is not quantised
      for (int c = 0; c < C; ++c) {
        rdinp[n * C + c] += qg[n * OC + o] * qw[o * C + c];
        rdw[o * C + c] += qg[n * OC + o] * qi[n * C + c];
      }
    }
  CHECK(relative_error(dinp.data, rdinp) < 1e-5);  // E5M2 gradients: E4M3 would miss by ~1e-2
  CHECK(relative_error(dw.data, rdw) < 1e-5);
  CHECK(relative_error(db.data, rdb) < 1e-5);
}

TEST_CASE("the weight is cast once per step and delayed amaxes are recorded per micro-batch", "[fp8][exact_gemm]") {
  const int N = 4, C = 16, OC = 16;
  Fp8Linear layer("test", policy(Fp8Recipe::delayed), cpu_backend(), N, C, OC);
  HostBuffer<float> w1({OC, C}, 0.5f), w2({OC, C}, 0.25f), inp({N, C}, 2.0f), out1({N, OC}), out2({N, OC});
  layer.forward(out1.view(), inp.view(), w1.view(), Tensor(), true);
  for (auto& v : inp.data) v = 4.0f;  // a second micro-batch with a larger amax
  layer.forward(out2.view(), inp.view(), w2.view(), Tensor(), true);
  // The second micro-batch still uses the first weight's cast: 16 * 4 * 0.5.
  CHECK(out2.data[0] == 32.0f);

  const auto states = layer.tensors();
  CHECK(states[0]->delayed.history()[0] == 4.0f);   // input: max over both micro-batches
  CHECK(states[1]->delayed.history()[0] == 0.5f);   // weight: cast once
  CHECK(states[0]->scale == 1.0f);                  // this step used the initial scale
  layer.end_step();
  CHECK(states[0]->delayed.scale() == 448.0f / 4.0f);  // from the finished step only
  CHECK(states[1]->delayed.scale() == 448.0f / 0.5f);
  layer.forward(out1.view(), inp.view(), w2.view(), Tensor(), true);
  CHECK(out1.data[0] == 16.0f);  // a new step casts the new weight: 16 * 4 * 0.25
}

TEST_CASE("native FP8 casts with statistics read once per step train and report as the emulation", "[fp8]") {
  const ModelShape shape{2, 2, 32, 16, 64, 128};
  const int B = 2, T = 16;
  for (const char* recipe : {"delayed", "current", "block"}) {
    INFO("recipe " << recipe);
    PrecisionConfig pc;
    pc.mode = PrecisionMode::fp8;
    pc.fp8.recipe = *parse_choice<Fp8Recipe>(recipe);
    const PrecisionPolicy policy = PrecisionPolicy::from_config(pc);
    DeferredFp8Backend deferred(cpu_backend());
    Transformer emulated(shape, cpu_backend(), DType::f32, B, T, policy), native(shape, deferred, DType::f32, B, T, policy);
    REQUIRE(native.fp8_gemm_summary().rfind("8 of 8 ", 0) == 0);  // every FP8 layer took the Fp8Gemms
    emulated.init(5);
    native.init(5);
    Rng rng(17);
    const auto tokens = [&] {
      std::vector<int32_t> t(B * T);
      for (auto& x : t) x = static_cast<int32_t>(rng.below(static_cast<uint64_t>(shape.vocab)));
      return t;
    };
    for (int step = 0; step < 3; ++step) {
      INFO("step " << step);
      emulated.zero_grad();
      native.zero_grad();
      for (int micro = 0; micro < 2; ++micro) {
        const auto in = tokens(), target = tokens();
        CHECK(emulated.forward(in.data(), target.data(), 0.03f) == native.forward(in.data(), target.data(), 0.03f));
        emulated.backward();
        native.backward();
      }
      const Tensor ge = emulated.grads_flat(), gn = native.grads_flat();
      CHECK(std::vector<float>(ge.as<float>(), ge.as<float>() + ge.numel()) ==
            std::vector<float>(gn.as<float>(), gn.as<float>() + gn.numel()));
      const auto in = tokens(), target = tokens();  // an evaluation: its casts are not recorded
      CHECK(emulated.forward(in.data(), target.data(), 0.0f) == native.forward(in.data(), target.data(), 0.0f));
      emulated.end_step();
      native.end_step();
      const std::vector<Fp8TensorState*> e = emulated.fp8_tensors(), n = native.fp8_tensors();
      REQUIRE(e.size() == n.size());
      for (size_t i = 0; i < e.size(); ++i) {
        check_same_fp8_state(*e[i], *n[i]);
        CHECK(n[i]->stats.nonzero > 0);
        if (step == 1) {  // telemetry starts afresh, as the trainer resets it after logging
          e[i]->reset_stats();
          n[i]->reset_stats();
        }
      }
    }
  }
}

TEST_CASE("the policy decides which layers run in fp8 and in which formats", "[fp8]") {
  const ModelShape shape{3, 2, 32, 16, 64, 128};
  auto fp8_names = [&](const std::vector<std::string>& overrides) {
    PrecisionConfig pc;
    pc.mode = PrecisionMode::fp8;
    for (const auto& o : overrides) {
      if (o == "first_last") pc.fp8.bf16_first_last = true;
      if (o == "lm_head") pc.fp8.bf16_lm_head = false;
      if (o == "e4m3") pc.fp8.format = Fp8Format::e4m3;
    }
    Transformer model(shape, cpu_backend(), DType::f32, 2, 16, PrecisionPolicy::from_config(pc));
    std::vector<std::pair<std::string, Format>> names;
    for (const Fp8TensorState* t : model.fp8_tensors()) names.emplace_back(t->name, t->format);
    return names;
  };
  const auto all = fp8_names({});
  REQUIRE(all.size() == 3 * 4 * 3);  // 3 layers x 4 linears x (input, weight, grad)
  CHECK(all.front() == std::make_pair(std::string("h0.qkv.input"), Format::e4m3));
  CHECK(all[2] == std::make_pair(std::string("h0.qkv.grad"), Format::e5m2));

  const auto middle = fp8_names({"first_last"});
  REQUIRE(middle.size() == 4 * 3);
  CHECK(middle.front().first == "h1.qkv.input");

  const auto head = fp8_names({"lm_head"});
  REQUIRE(head.size() == 3 * 4 * 3 + 3);
  CHECK(head.back().first == "lm_head.grad");

  for (const auto& [name, format] : fp8_names({"e4m3"})) CHECK(format == Format::e4m3);
}

// precision.fp8.primary_weights: the block linears keep no copy in the weight format (their
// param() is the FP32 master), and their FP8 casts read the master itself. Shown by a weight bf16
// cannot hold made the largest of h0's qkv: the cast's amax is that FP32 value with primary
// weights, its bf16 rounding without.
TEST_CASE("primary FP8 weights keep no bf16 copy of the block linears, whose casts read the FP32 master", "[fp8]") {
  const ModelShape shape{2, 2, 32, 16, 64, 128};
  const int B = 2, T = 16;
  const float odd = 0.5f + 0x1p-20f;  // bf16 keeps 8 significant bits: it rounds this to 0.5
  std::vector<int32_t> tokens(B * T);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7 + 3) % 64);
  const auto weight_amax = [&](bool primary) {
    PrecisionConfig pc;
    pc.mode = PrecisionMode::fp8;
    pc.fp8.primary_weights = primary;
    const PrecisionPolicy policy = PrecisionPolicy::from_config(pc);
    Transformer model(shape, cpu_backend(), DType::f32, B, T, policy);
    const auto linears = block_linear_shapes(shape);
    int64_t linear_weights = 0;
    for (const auto& [C, OC] : linears) linear_weights += C * OC * shape.n_layer;
    CHECK(primary_fp8_weight_count(shape, policy) == (primary ? linear_weights : 0));
    CHECK(model.params_flat().numel() == model.num_params() - (primary ? linear_weights : 0));
    for (const ParamSpec& spec : model.specs()) {
      INFO(spec.name);
      const bool linear = is_block_linear(spec.id);
      CHECK(model.weight_copy(spec.id).empty() == (primary && linear));
      CHECK((model.param(spec.id).data == model.master(spec.id).data) == (primary && linear));
    }
    model.init(1);
    std::vector<float> qkv(static_cast<size_t>(model.master(kQkvw).numel()));
    cpu_backend().download(qkv.data(), model.master(kQkvw));
    qkv[0] = odd;  // h0's (the stacked tensor's first layer), above the init's 0.02 * a few
    cpu_backend().upload(model.master(kQkvw), qkv.data());
    model.weights_loaded();
    model.forward(tokens.data(), tokens.data(), 1.0f / (B * T));
    for (const Fp8TensorState* t : model.fp8_tensors())
      if (t->name == "h0.qkv.weight") return t->stats.amax;
    FAIL("no h0.qkv.weight");
    return 0.0f;
  };
  CHECK(weight_amax(true) == odd);
  CHECK(weight_amax(false) == 0.5f);
}

// precision.fp8.mlp_input_codes on the CPU (its store emulated): the model keeps one layer of the
// MLP's pre-activation in its activation block instead of every layer's, and its gradients stay
// within FP8's own noise of the plain FP8 model's. The noise is measured: the plain FP8 model's
// distance from bf16's, which is of the size the added 1x128 E4M3 rounding of the pre-activation
// brings. A backward pass that read another layer's pre-activation (the one room's last writer)
// is off by the whole gradient and fails.
TEST_CASE("the MLP's input kept as FP8 codes: one layer of room, gradients within FP8's noise", "[fp8]") {
  const ModelShape gpt2{2, 4, 128, 32, 64, 128};
  const ModelShape shape = GENERATE_COPY(values<ModelShape>({gpt2, llama_shape(gpt2, 2, 256)}));
  INFO(choice_name(shape.arch));
  const int B = 2, T = 32;
  std::vector<int32_t> inputs(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) {
    inputs[i] = (i * 37 + 11) % shape.vocab;
    targets[i] = (i * 53 + 7) % shape.vocab;
  }
  const auto policy = [](PrecisionMode mode, bool codes) {
    PrecisionConfig c;
    c.mode = mode;
    c.fp8.mlp_input_codes = codes;
    return PrecisionPolicy::from_config(c);
  };
  const PrecisionPolicy with_codes = policy(PrecisionMode::fp8, true);
  CHECK(keeps_mlp_input_codes(with_codes, Recompute::none, true));
  CHECK_FALSE(keeps_mlp_input_codes(with_codes, Recompute::mlp, true));
  CHECK_FALSE(keeps_mlp_input_codes(with_codes, Recompute::none, false));
  const auto made = [&](const PrecisionPolicy& p, bool throughout) {
    return std::make_unique<Transformer>(shape, cpu_backend(), DType::f32, B, T, p, AttentionPath::fallback, true,
                                         Recompute::none, MasterRange{}, throughout);
  };
  auto coded = made(with_codes, true), plain = made(policy(PrecisionMode::fp8, false), true),
       bf16 = made(policy(PrecisionMode::bf16, false), false);
  const int64_t fc_width = block_linear_shapes(shape)[kFc][1];
  CHECK(plain->activation_bytes() - coded->activation_bytes() ==
        static_cast<size_t>((shape.n_layer - 1) * B * T * fc_width) * sizeof(float));
  std::vector<std::vector<float>> grads[3];
  int m = 0;
  for (Transformer* model : {coded.get(), plain.get(), bf16.get()}) {
    model->init(7);
    model->zero_grad();
    model->forward(inputs.data(), targets.data(), 1.0f / (B * T));
    model->backward();
    for (const ParamSpec& spec : model->specs()) {
      std::vector<float> g(static_cast<size_t>(model->grad(spec.id).numel()));
      cpu_backend().download(g.data(), model->grad(spec.id));
      grads[m].push_back(std::move(g));
    }
    ++m;
  }
  // The numerics log sees each layer's store: what its training casts counted, once; an
  // evaluation's casts count nowhere.
  const std::vector<Fp8TensorState*> logged = coded->numerics_tensors();
  std::vector<int64_t> counted;
  for (int l = 0; l < shape.n_layer; ++l) counted.push_back(logged[logged.size() - shape.n_layer + l]->stats.nonzero);
  coded->forward(inputs.data(), targets.data(), 0.0f);
  CHECK(coded->numerics_tensors().size() == logged.size());
  for (int l = 0; l < shape.n_layer; ++l) CHECK(logged[logged.size() - shape.n_layer + l]->stats.nonzero == counted[l]);
  REQUIRE(logged.size() == plain->fp8_tensors().size() + static_cast<size_t>(shape.n_layer));
  for (int l = 0; l < shape.n_layer; ++l) {
    const Fp8TensorState& t = *logged[logged.size() - static_cast<size_t>(shape.n_layer - l)];
    INFO(t.name);
    CHECK(t.name == "h" + std::to_string(l) + (shape.arch == Arch::llama ? ".gate_up" : ".fc") + ".output");
    CHECK(t.stats.nonzero > 0);
    CHECK(t.stats.nonzero <= B * T * fc_width);
  }
  for (size_t i = 0; i < grads[0].size(); ++i) {
    const double noise = relative_error(grads[1][i], grads[2][i]), err = relative_error(grads[0][i], grads[1][i]);
    INFO(coded->specs()[i].name << ": codes vs plain FP8 " << err << ", plain FP8 vs bf16 " << noise);
    CHECK(err <= std::max(0.05, 1.5 * noise));
  }
}
