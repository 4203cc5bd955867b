#include "optim/adamw.h"

#include <cmath>

namespace ptrain {

AdamW::AdamW(Gpt& model, Backend& backend, const AdamWConfig& config)
    : model_(model), backend_(backend), config_(config) {
  const Tensor& p = model.master_flat();
  m_ = Tensor(backend.allocate(p.bytes()), p.dtype, {p.numel()}, p.device);
  v_ = Tensor(backend.allocate(p.bytes()), p.dtype, {p.numel()}, p.device);
}

AdamW::~AdamW() {
  backend_.release(v_.data);
  backend_.release(m_.data);
}

double AdamW::grad_norm() { return std::sqrt(backend_.sum_squares(model_.grads_flat())); }

void AdamW::step(double lr, double grad_norm, double loss_scale) {
  ++t_;
  AdamWParams p;
  p.lr = static_cast<float>(lr);
  p.beta1 = static_cast<float>(config_.beta1);
  p.beta2 = static_cast<float>(config_.beta2);
  p.eps = static_cast<float>(config_.eps);
  p.step = t_;
  double clip = 1.0;
  if (config_.grad_clip > 0 && grad_norm > config_.grad_clip) clip = config_.grad_clip / grad_norm;
  p.grad_scale = static_cast<float>(clip / loss_scale);

  // Walk the flat buffers tensor by tensor: weight decay applies to 2-D weights only.
  const bool has_copy = model_.master_flat().data != model_.params_flat().data;
  int64_t offset = 0;
  for (int i = 0; i < kNumParams; ++i) {
    const int64_t n = model_.param(static_cast<ParamId>(i)).numel();
    auto slice = [&](const Tensor& flat) { return flat.range(offset, n); };
    p.weight_decay = model_.specs()[i].weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f;
    backend_.adamw(slice(model_.master_flat()), slice(model_.grads_flat()), slice(m_), slice(v_), p,
                   has_copy ? slice(model_.params_flat()) : Tensor());
    offset += n;
  }
}

}  // namespace ptrain
