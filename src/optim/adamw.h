// AdamW over a model's parameter tensors: FP32 first and second moments and master weights,
// decoupled weight decay on 2-D weights only, and global-norm gradient clipping. After each
// update the low-precision copy the GEMMs read is refreshed from the master weights.
//
// Data parallelism: the optimizer owns the gradient exchange. With ZeRO stage 0 every rank sums
// the full gradients (all-reduce) and updates every parameter. With stage 1 (ZeRO-1) each rank
// owns one contiguous shard of the flat parameters (dist/communicator.h shard_of): gradients are
// reduce-scattered, the rank keeps moments and FP32 master weights for its shard only, updates
// it, and the updated copies are all-gathered. Both compute the same numbers.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "dist/communicator.h"
#include "model/transformer.h"

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
  // `comm` (null: one process) must outlive the optimizer; zero_stage is 0 or 1.
  AdamW(Transformer& model, Backend& backend, const AdamWConfig& config, Communicator* comm = nullptr, int zero_stage = 0);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // Sums the ranks' gradients (all-reduce, or reduce-scatter into this rank's shard) and returns
  // the global L2 norm of the summed gradients as stored (before clipping and unscaling); the
  // same on every rank. Call once per step, after the last backward pass. `summed_in_backward`:
  // the trainer already started the all-reduce block by block (ZeRO-0 on a communicator that
  // overlaps_compute()); this waits for it instead.
  double reduce_gradients(bool summed_in_backward = false);
  // One update with learning rate `lr`, from the gradients reduce_gradients() left. `grad_norm`
  // is the true gradient norm (after removing the loss scale) and `loss_scale` the factor the
  // stored gradients still carry.
  void step(double lr, double grad_norm, double loss_scale = 1.0);

  int64_t steps_taken() const { return t_; }
  void restore_steps(int64_t t) { t_ = t; }  // resuming: bias correction continues from t
  // The moments of this rank's shard (the whole flat parameter vector without ZeRO-1).
  Tensor first_moment() const { return m_; }
  Tensor second_moment() const { return v_; }
  Shard shard() const { return shard_; }
  bool sharded() const { return zero_stage_ == 1 && world_ > 1; }
  // ZeRO-1 with separate FP32 master weights: this rank's shard of them, which the model keeps
  // (MasterRange, made with master_range()); else empty.
  Tensor master_shard() const { return model_.master_shard(); }
  // Bytes this rank holds for the optimizer: moments, plus the master shard it owns.
  size_t state_bytes() const { return m_.bytes() + v_.bytes() + (master_shard().empty() ? 0 : master_shard().bytes()); }
  // The range of the master weights a model must keep to be this optimizer's under ZeRO-1 with
  // `world` ranks (all of them otherwise).
  static MasterRange master_range(int64_t num_params, int zero_stage, int rank, int world);

 private:
  Tensor allocate(int64_t n, DType dtype, Format format);

  Transformer& model_;
  Backend& backend_;
  AdamWConfig config_;
  Communicator* comm_;
  int zero_stage_;
  int world_ = 1;
  Shard shard_;
  Tensor m_, v_;           // FP32, the shard's (or the whole) flat layout
  Tensor grad_shard_;      // ZeRO-1: this rank's shard of the summed gradients, in the model's gradient buffer
  std::vector<void*> memory_;
  int64_t t_ = 0;
};

}  // namespace ptrain
