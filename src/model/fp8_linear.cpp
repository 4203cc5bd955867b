#include "model/fp8_linear.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "core/error.h"
#include "core/tensor.h"

namespace ptrain {

static Fp8TensorState make_state(const std::string& name, Format format, const Fp8Policy& p) {
  return Fp8TensorState{name, format, DelayedScaling(p.amax_history, p.amax_algo, format_max(format), p.margin), 1.0f,
                        Fp8CastStats{}};
}

Fp8Linear::Fp8Linear(const std::string& name, const Fp8Policy& policy, Backend& backend, int64_t rows, int64_t C,
                     int64_t OC, int input_slot, Weight weight)
    : policy_(policy),
      backend_(backend),
      weights_(C * OC),
      C_(C),
      OC_(OC),
      input_(make_state(name + ".input", policy.forward, policy)),
      weight_(make_state(name + ".weight", policy.forward, policy)),
      grad_(make_state(name + ".grad", policy.backward, policy)),
      input_slot_(input_slot),
      weight_mode_(weight) {
  const bool blocks = policy.recipe == Fp8Recipe::block;
  if (blocks && policy.block != kNativeBlock)
    why_emulated_ = "block size " + std::to_string(policy.block) + ": block-scaled GEMMs take " +
                    std::to_string(kNativeBlock) + " only";
  else
    gemms_ = backend.make_fp8_gemms(rows, C, OC, blocks ? Fp8Gemms::Scaling::blocks : Fp8Gemms::Scaling::tensor,
                                    policy.forward, policy.backward, input_slot,
                                    weight_mode_ == Weight::recast           ? Fp8Gemms::WeightCodes::shared
                                    : weight_mode_ == Weight::primary_handed ? Fp8Gemms::WeightCodes::handed
                                                                             : Fp8Gemms::WeightCodes::own,
                                    &why_emulated_);
  if (gemms_) return;  // the backend keeps the FP8 codes itself
  allocate_like(input_q_, {rows, C});
  if (weight_mode_ != Weight::primary_handed) allocate_like(weight_q_, {OC, C});
  allocate_like(grad_q_, {rows, OC});
  if (blocks) {
    allocate_like(input_qt_, {rows, C});
    allocate_like(grad_qt_, {rows, OC});
  }
}

int64_t Fp8Linear::buffer_bytes(const Fp8Policy& policy, int64_t rows, int64_t C, int64_t OC, Weight weight) {
  const int64_t per_copy = rows * C + rows * OC;  // input and gradient
  const int64_t copies = policy.recipe == Fp8Recipe::block ? 2 : 1;
  const int64_t weight_codes = weight == Weight::primary_handed ? 0 : OC * C;
  return static_cast<int64_t>(sizeof(float)) * (copies * per_copy + weight_codes);
}

Fp8Linear::~Fp8Linear() {
  for (void* p : memory_) backend_.release(p);
}

void* Fp8Linear::allocate_like(Tensor& slot, const std::vector<int64_t>& shape) {
  void* p = backend_.allocate(static_cast<size_t>(shape_numel(shape)) * sizeof(float));
  memory_.push_back(p);
  slot = Tensor(p, DType::f32, shape, backend_.device());
  return p;
}

void Fp8Linear::cast(Fp8TensorState& state, Fp8Gemms::Operand operand, Tensor out, Tensor in, int block_rows,
                     int block_cols, bool training) {
  if (gemms_) {  // queued on the device; its statistics are read in settle()
    switch (policy_.recipe) {
      case Fp8Recipe::delayed: gemms_->cast(operand, in, state.format, state.delayed.scale(), training); break;
      case Fp8Recipe::current: gemms_->cast_current(operand, in, state.format, training); break;
      case Fp8Recipe::block: gemms_->cast_blocks(operand, in, state.format, block_rows, block_cols, training); break;
    }
    unsettled_ = unsettled_ || training;
    return;
  }
  Fp8CastStats s;
  float scale = NAN;  // block scaling: one scale per block, no single one to report
  switch (policy_.recipe) {
    case Fp8Recipe::delayed:
      scale = state.delayed.scale();
      s = backend_.fp8_cast(out, in, state.format, scale);
      if (training) state.delayed.record(s.amax);
      break;
    case Fp8Recipe::current:
      scale = current_scale(backend_.amax(in), format_max(state.format));
      s = backend_.fp8_cast(out, in, state.format, scale);
      break;
    case Fp8Recipe::block: s = backend_.fp8_cast_blocks(out, in, state.format, block_rows, block_cols); break;
  }
  if (!training) return;
  state.scale = scale;
  state.stats.merge(s);
}

void Fp8Linear::settle() {
  if (!unsettled_) return;
  unsettled_ = false;
  const std::array<Fp8Gemms::OperandStats, 3> taken = gemms_->take_stats();
  Fp8TensorState* states[3] = {&input_, &weight_, &grad_};  // in Fp8Gemms::Operand order
  for (int i = 0; i < 3; ++i) {
    Fp8TensorState& state = *states[i];
    state.stats.merge(taken[i].stats);
    if (policy_.recipe == Fp8Recipe::delayed) {
      state.delayed.record(taken[i].stats.amax);
      state.scale = state.delayed.scale();  // what this step's casts used
    } else if (taken[i].scale != 0) {       // 0: no cast of this operand since the last read
      state.scale = taken[i].scale;         // the latest cast's (NaN with block scaling)
    }
  }
}

void Fp8Linear::take_handed_codes(Tensor codes) {
  PTRAIN_CHECK(codes.numel() == weights_ && codes.dtype == weight_code_dtype(),
               weight_.name + ": expected the weight's " + std::to_string(weights_) + " codes as " +
                   dtype_name(weight_code_dtype()) + ", got " + codes.shape_string());
  if (gemms_)
    gemms_->bind_weight_codes(codes.reshaped({OC_, C_}));
  else
    weight_q_ = codes.reshaped({OC_, C_});
}

void Fp8Linear::forward(Tensor out, Tensor inp, Tensor weight, Tensor bias, bool training) {
  const int block = policy_.block;
  PTRAIN_CHECK(!primary_weight() || weight_cast_ || !training,
               weight_.name + ": a primary FP8 weight is cast by cast_weight(), not forward()");
  if (weight_mode_ == Weight::primary_handed) take_handed_codes(weight);
  if (weight_mode_ == Weight::recast || (!weight_cast_ && !primary_weight())) {
    cast(weight_, Fp8Gemms::kWeight, weight_q_, weight, block, block, training);
    weight_cast_ = training;  // an evaluation's cast is not the training step's
  }
  cast_input(inp, training, /*wgrad=*/training);
  if (gemms_) return gemms_->forward(out, bias);
  backend_.matmul_forward(out, input_q_, weight_q_, bias);
}

void Fp8Linear::cast_input(Tensor inp, bool training, bool wgrad) {
  const int block = policy_.block;
  cast(input_, Fp8Gemms::kInput, input_q_, inp, 1, block, training);
  // The block recipe's wgrad contracts over tokens: 128x1 tiles, kept for the backward pass.
  if (wgrad && policy_.recipe == Fp8Recipe::block) cast(input_, Fp8Gemms::kInput, input_qt_, inp, block, 1, training);
}

void Fp8Linear::recast_input(Tensor inp) {
  if (shares_input_codes()) cast_input(inp, /*training=*/false, /*wgrad=*/true);
}

void Fp8Linear::cast_weight(Tensor master, bool training) {
  PTRAIN_CHECK(weight_mode_ == Weight::primary,
               weight_.name + ": cast_weight() is for primary FP8 weights whose codes the layer keeps");
  cast(weight_, Fp8Gemms::kWeight, weight_q_, master, policy_.block, policy_.block, training);
  weight_cast_ = weight_cast_ || training;
}

int64_t Fp8Linear::weight_amax_count() const {
  const int64_t b = policy_.block;
  return 1 + (policy_.recipe == Fp8Recipe::block ? (OC_ + b - 1) / b * ((C_ + b - 1) / b) : 0);
}

void Fp8Linear::weight_part_amaxes(Tensor part, int64_t first, float* amaxes) {
  PTRAIN_CHECK(primary_weight() && first >= 0 && first + part.numel() <= weights_,
               weight_.name + ": weight_part_amaxes takes a part of a primary FP8 weight");
  if (part.numel() == 0) return;
  const float a = backend_.amax(part);
  amaxes[0] = std::isnan(a) || std::isnan(amaxes[0]) ? NAN : std::max(amaxes[0], a);
  if (policy_.recipe == Fp8Recipe::block)
    backend_.fp8_block_amaxes(amaxes + 1, part, first, C_, policy_.block, policy_.block);
}

void Fp8Linear::agree_weight_scales(const float* amaxes, bool training) {
  const float max = format_max(weight_.format);
  weight_amax_ = amaxes[0];
  switch (policy_.recipe) {
    case Fp8Recipe::delayed:
      weight_scales_ = {weight_.delayed.scale()};
      if (training) weight_.delayed.record(amaxes[0]);
      break;
    case Fp8Recipe::current: weight_scales_ = {current_scale(amaxes[0], max)}; break;
    case Fp8Recipe::block:
      weight_scales_.resize(static_cast<size_t>(weight_amax_count() - 1));
      for (size_t b = 0; b < weight_scales_.size(); ++b) weight_scales_[b] = current_scale(amaxes[b + 1], max);
      break;
  }
  if (gemms_) gemms_->set_weight_scales(weight_.format, weight_scales_);
}

Tensor Fp8Linear::weight_codes() const {
  PTRAIN_CHECK(weight_mode_ != Weight::primary_handed, weight_.name + ": the layer is handed its weight's codes and keeps none");
  const Tensor codes = gemms_ ? gemms_->weight_codes() : weight_q_;
  return codes.range(0, weights_);
}

Fp8CastStats Fp8Linear::encode_weight_part(Tensor part, int64_t first) {
  return encode_weight_part(part, first, weight_codes().range(first, part.numel()));
}

Fp8CastStats Fp8Linear::encode_weight_part(Tensor part, int64_t first, Tensor codes) {
  PTRAIN_CHECK(!weight_scales_.empty(), weight_.name + ": encode_weight_part needs agree_weight_scales first");
  PTRAIN_CHECK(codes.numel() == part.numel() && codes.dtype == weight_code_dtype(),
               weight_.name + ": encode_weight_part writes one code per element, as " + dtype_name(weight_code_dtype()));
  return backend_.fp8_encode(codes, part, weight_.format, weight_scales_, first, C_, policy_.block, policy_.block);
}

void Fp8Linear::finish_weight_cast(const Fp8CastStats& all_parts, bool training) {
  PTRAIN_CHECK(!weight_scales_.empty(), weight_.name + ": finish_weight_cast needs agree_weight_scales first");
  if (training) {  // as cast() records a training cast
    weight_.scale = policy_.recipe == Fp8Recipe::block ? NAN : weight_scales_[0];
    Fp8CastStats s = all_parts;
    s.amax = weight_amax_;
    weight_.stats.merge(s);
    weight_cast_ = true;
  }
  weight_scales_.clear();
}

void Fp8Linear::backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor weight) {
  const int block = policy_.block;
  if (weight_mode_ == Weight::recast) cast(weight_, Fp8Gemms::kWeight, weight_q_, weight, block, block, /*training=*/true);
  if (weight_mode_ == Weight::primary_handed) take_handed_codes(weight);
  cast(grad_, Fp8Gemms::kGrad, grad_q_, dout, 1, block, /*training=*/true);
  const bool blocks = policy_.recipe == Fp8Recipe::block;
  if (blocks) cast(grad_, Fp8Gemms::kGrad, grad_qt_, dout, block, 1, /*training=*/true);
  if (gemms_) {
    gemms_->backward(dinp, dweight);
  } else if (!blocks) {
    backend_.matmul_backward(dinp, dweight, Tensor(), grad_q_, input_q_, weight_q_);
  } else {
    backend_.matmul_backward(dinp, Tensor(), Tensor(), grad_q_, input_q_, weight_q_);
    backend_.matmul_backward(Tensor(), dweight, Tensor(), grad_qt_, input_qt_, weight_q_);
  }
  if (!dbias.empty()) backend_.bias_backward(dbias, dout);
}

std::string Fp8Linear::unrecordable() const {
  if (!gemms_) return "FP8 layers that emulate read every cast's statistics back at once (" + why_emulated_ + ")";
  // Current and block scaling find their scales on the device; delayed scales come from the
  // host's amax history, new every step, and a recording would keep the first step's.
  if (policy_.recipe == Fp8Recipe::delayed) return "delayed FP8 scaling hands the casts each step's new scales from the host";
  return "";
}

void Fp8Linear::abandon_step() {
  settle();
  for (Fp8TensorState* s : {&input_, &weight_, &grad_}) s->delayed.discard_current();
  weight_cast_ = false;
}

void Fp8Linear::end_step() {
  settle();
  if (policy_.recipe == Fp8Recipe::delayed)
    for (Fp8TensorState* s : {&input_, &weight_, &grad_}) s->delayed.end_step();
  weight_cast_ = false;
}

}  // namespace ptrain
