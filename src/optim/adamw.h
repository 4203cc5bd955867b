// AdamW over a model's parameter tensors: FP32 first and second moments and master weights,
// decoupled weight decay on 2-D weights only, and global-norm gradient clipping. After each
// update the low-precision copy the GEMMs read is refreshed from the master weights.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "model/gpt.h"

namespace ptrain {

struct AdamWConfig {
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // 0 = no clipping
};

class AdamW {
 public:
  AdamW(Gpt& model, Backend& backend, const AdamWConfig& config);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // The global L2 norm of the model's gradients as stored (before clipping and unscaling).
  double grad_norm();
  // One update with learning rate `lr`. `grad_norm` is the true gradient norm (after removing
  // the loss scale) and `loss_scale` the factor the stored gradients still carry.
  void step(double lr, double grad_norm, double loss_scale = 1.0);

  int64_t steps_taken() const { return t_; }
  Tensor first_moment() const { return m_; }
  Tensor second_moment() const { return v_; }
  void restore_steps(int64_t t) { t_ = t; }  // resuming: bias correction continues from t
  size_t state_bytes() const { return 2 * m_.bytes(); }

 private:
  Gpt& model_;
  Backend& backend_;
  AdamWConfig config_;
  Tensor m_, v_;  // same layout as the model's flat parameters
  int64_t t_ = 0;
};

}  // namespace ptrain
