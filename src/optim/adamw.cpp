#include "optim/adamw.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace ptrain {

AdamW::AdamW(Transformer& model, Backend& backend, const AdamWConfig& config, Communicator* comm, int zero_stage)
    : model_(model), backend_(backend), config_(config), comm_(comm), zero_stage_(zero_stage) {
  PTRAIN_CHECK(zero_stage == 0 || zero_stage == 1, "AdamW: zero_stage must be 0 or 1");
  world_ = comm ? comm->world_size() : 1;
  // The moments are stored as the FP32 gradients are (f32, or the CPU's compute dtype).
  const Tensor& g = model.grads_flat();
  shard_ = sharded() ? shard_of(g.numel(), comm->rank(), world_) : Shard{0, g.numel()};
  PTRAIN_CHECK(!model.has_master_weights() || sharded() == !model.master_shard().empty(),
               "AdamW: a model under ZeRO-1 keeps its shard of the master weights (AdamW::master_range), and only then");
  PTRAIN_CHECK(model.master_shard().empty() || model.master_shard().numel() == shard_.count,
               "AdamW: the model's master shard is not this rank's");
  m_ = allocate(shard_.count, g.dtype, Format::fp32);
  v_ = allocate(shard_.count, g.dtype, Format::fp32);
  // ZeRO-1 sums the gradients into this rank's shard of the main-gradient buffer itself (an
  // in-place reduce-scatter, as Megatron's distributed optimizer does): no second gradient block.
  if (sharded()) grad_shard_ = model.grads_flat().range(shard_.begin, shard_.count);
}

AdamW::~AdamW() {
  for (void* p : memory_) backend_.release(p);
}

Tensor AdamW::allocate(int64_t n, DType dtype, Format format) {
  memory_.push_back(backend_.allocate(static_cast<size_t>(std::max<int64_t>(n, 1)) * dtype_size(dtype)));
  Tensor t(memory_.back(), dtype, {n}, backend_.device());
  t.format = format;
  return t;
}

MasterRange AdamW::master_range(int64_t num_params, int zero_stage, int rank, int world) {
  if (zero_stage != 1 || world <= 1) return {};
  const Shard s = shard_of(num_params, rank, world);
  return {s.begin, s.count};
}

double AdamW::reduce_gradients(bool summed_in_backward) {
  const Tensor grads = model_.grads_flat();
  if (sharded()) {
    comm_->reduce_scatter_sum(grad_shard_, grads);
    return std::sqrt(comm_->all_reduce_sum(backend_.sum_squares(grad_shard_)));
  }
  if (world_ == 1) return std::sqrt(backend_.sum_squares(grads));
  if (summed_in_backward)
    comm_->wait();
  else
    comm_->all_reduce_sum(grads);
  // Each rank squares its ZeRO-1 shard of the summed gradients and the ranks add them, as ZeRO-1
  // does: both stages clip by the same norm, and a GPU syncs once.
  const Shard s = shard_of(grads.numel(), comm_->rank(), world_);
  return std::sqrt(comm_->all_reduce_sum(backend_.sum_squares(grads.range(s.begin, s.count))));
}

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

  // The range [shard_.begin, + count) of the flat layout this rank updates, and its tensors.
  const Tensor params = model_.params_flat();
  const Tensor master = !master_shard().empty() ? master_shard()
                        : sharded()              ? params.range(shard_.begin, shard_.count)
                                                 : model_.master_flat();
  const Tensor grads = sharded() ? grad_shard_ : model_.grads_flat();
  const bool has_copy = model_.has_master_weights();  // the update also writes the GEMMs' copy
  // Walk the parameter tensors that overlap the range: weight decay applies to 2-D weights only.
  int64_t offset = 0;
  for (const ParamSpec& spec : model_.specs()) {
    const int64_t n = model_.param(spec.id).numel();
    const int64_t lo = std::max(offset, shard_.begin), hi = std::min(offset + n, shard_.begin + shard_.count);
    if (lo < hi) {
      const int64_t local = lo - shard_.begin, len = hi - lo;
      p.weight_decay = spec.weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f;
      backend_.adamw(master.range(local, len), grads.range(local, len), m_.range(local, len), v_.range(local, len),
                     p, has_copy ? params.range(lo, len) : Tensor());
    }
    offset += n;
  }
  if (sharded()) comm_->all_gather(params, params.range(shard_.begin, shard_.count));
}

}  // namespace ptrain
