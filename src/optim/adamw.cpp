#include "optim/adamw.h"

#include <cmath>

namespace ptrain {

AdamW::AdamW(Gpt& model, Backend& backend, const AdamWConfig& config)
    : model_(model), backend_(backend), config_(config) {
  const Tensor& p = model.params_flat();
  m_ = Tensor(backend.allocate(p.bytes()), p.dtype, {p.numel()}, p.device);
  v_ = Tensor(backend.allocate(p.bytes()), p.dtype, {p.numel()}, p.device);
}

AdamW::~AdamW() {
  backend_.release(v_.data);
  backend_.release(m_.data);
}

double AdamW::grad_norm() { return std::sqrt(backend_.sum_squares(model_.grads_flat())); }

void AdamW::step(double lr, double grad_norm) {
  ++t_;
  AdamWParams p;
  p.lr = static_cast<float>(lr);
  p.beta1 = static_cast<float>(config_.beta1);
  p.beta2 = static_cast<float>(config_.beta2);
  p.eps = static_cast<float>(config_.eps);
  p.step = t_;
  p.grad_scale = 1.0f;
  if (config_.grad_clip > 0 && grad_norm > config_.grad_clip)
    p.grad_scale = static_cast<float>(config_.grad_clip / grad_norm);

  // Walk the flat buffers tensor by tensor: weight decay applies to 2-D weights only.
  const size_t elem = dtype_size(m_.dtype);
  int64_t offset = 0;
  for (int i = 0; i < kNumParams; ++i) {
    Tensor param = model_.param(static_cast<ParamId>(i));
    const int64_t n = param.numel();
    auto slice = [&](const Tensor& flat) {
      return Tensor(flat.as<char>() + offset * elem, flat.dtype, {n}, flat.device);
    };
    p.weight_decay = model_.specs()[i].weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f;
    backend_.adamw(slice(model_.params_flat()), slice(model_.grads_flat()), slice(m_), slice(v_), p);
    offset += n;
  }
}

}  // namespace ptrain
