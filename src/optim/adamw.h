// AdamW over a model's parameter tensors: FP32 first and second moments and master weights,
// decoupled weight decay on 2-D weights only, and global-norm gradient clipping. After each
// update the low-precision copy the GEMMs read is refreshed from the master weights.
//
// Data parallelism: the optimizer owns the gradient exchange. With ZeRO stage 0 every rank sums
// the full gradients (all-reduce) and updates every parameter. With stage 1 (ZeRO-1) each rank
// owns one contiguous shard of the flat parameters (dist/communicator.h shard_of): gradients are
// reduce-scattered, the rank keeps moments and FP32 master weights for its shard only, updates
// it, and the updated copies are all-gathered. Both compute the same numbers. Stage 2 (ZeRO-2)
// keeps no parameter-sized gradient buffer either: the model's backward pass hands over each
// block's gradients in a bucket (MasterRange::grad_buckets), each bucket is reduce-scattered to
// the ranks that own its elements, and each rank adds its part into its FP32 gradient shard,
// micro-batch after micro-batch. With one micro-batch per rank and step this is ZeRO-0's sum
// bit for bit; with more, ZeRO-0 adds a rank's micro-batches before the ranks' sums and ZeRO-2
// after, the same additions in another order (FP32 rounding apart). Stage 3 (ZeRO-3) shards the
// GEMMs' copy of the weights too: the update writes this rank's range of it, and the model's
// passes gather each block's weights a block before reading them (start_weight_gather). With
// primary FP8 weights each rank keeps its range's block linears as FP8 codes only, cast from its
// master shard once a step (gather_primary_fp8_weights), and the passes gather those codes.
//
// distributed.grad_reduce_dtype: bf16 halves the gradient exchange's bytes: a chunk at a time
// (wire_chunk() elements), each rank's FP32 sums are rounded to bf16 into a staging block, the
// communicator sums the bf16 copies in bf16 (NCCL rounds after each addition of its reduction;
// the MPI communicator adds in rank order, rounding each addition the same way), and the sums
// are widened back into the FP32 buffer. A gradient element is then rounded once per rank and
// once per addition: up to 2^-8 relative each (bf16 keeps 8 significant bits; FP32 24). ZeRO-2
// exchanges each grad bucket so, a chunk at a time, after the backward pass has finished it.
#pragma once

#include <functional>
#include <optional>
#include <vector>

#include "backend/backend.h"
#include "config/choices.h"
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
  // `comm` (null: one process) must outlive the optimizer; zero_stage is 0 to 3 (the model made
  // with master_range()'s for it).
  AdamW(Transformer& model, Backend& backend, const AdamWConfig& config, Communicator* comm = nullptr, int zero_stage = 0,
        GradReduceDtype wire = GradReduceDtype::fp32);
  ~AdamW();
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // Sums the ranks' gradients (all-reduce, or reduce-scatter into this rank's shard) and returns
  // the global L2 norm of the summed gradients as stored (before clipping and unscaling); the
  // same on every rank. Call once per step, after the last backward pass. `summed_in_backward`:
  // the trainer already started the all-reduce block by block (ZeRO-0 on a communicator that
  // overlaps_compute()); this waits for it instead.
  double reduce_gradients(bool summed_in_backward = false);
  // ZeRO-2: sums the model's grad bucket `bucket` over ranks (Transformer::grads_done's
  // argument) into each owner's gradient shard, replacing what the shard held at a step's first
  // micro-batch (`first_micro_batch`), else adding to it. Every rank calls it for each bucket,
  // as the backward pass hands it on. On a communicator that overlaps_compute() the sum runs
  // beside the next block's backward pass and lands in the shard when the next bucket is handed
  // on (its room is then about to be reused); the embeddings' bucket, the last, lands at once.
  void reduce_grad_bucket(int bucket, bool first_micro_batch);
  // ZeRO-3 (Transformer::set_weight_gather's two calls): starts gathering the weights of the
  // model's weight bucket `bucket` into its weight room from the ranks' ranges (and a block's
  // primary FP8 weights' codes into its code rooms); after
  // wait_weight_gathers(), what the model queues next sees every gather started so far. On a
  // communicator that overlaps_compute() the gather runs beside the compute queued meanwhile.
  // Every rank calls them alike.
  void start_weight_gather(int bucket);
  void wait_weight_gathers();
  // One update with learning rate `lr`, from the gradients reduce_gradients() left. `grad_norm`
  // is the true gradient norm (after removing the loss scale) and `loss_scale` the factor the
  // stored gradients still carry.
  void step(double lr, double grad_norm, double loss_scale = 1.0);

  // ZeRO-1 to 3 with primary FP8 weights whose cast is due before a training forward pass
  // (`training`) or an evaluation (Transformer::primary_fp8_cast_due): each rank casts its
  // shard's part of every block linear's weight, with scales the ranks agree on, and the ranks
  // all-gather the FP8 codes into each layer's (the other tensors' copies are gathered by
  // step()); under ZeRO-3 each rank keeps its part's codes, which the passes gather with the
  // other tensors' copies a block at a time. Nothing otherwise (unsharded, the model casts from
  // its own master). Every rank calls it, before such a forward pass.
  void gather_primary_fp8_weights(bool training);
  // The whole FP32 master weights (or the FP32 parameters) in the flat layout on rank 0, gathered
  // from the ranks' shards under ZeRO-1 (every rank calls it then); empty on the other ranks.
  std::vector<float> master_on_main() const;

  int64_t steps_taken() const { return t_; }
  void restore_steps(int64_t t) { t_ = t; }  // resuming: bias correction continues from t
  // The moments of this rank's shard (the whole flat parameter vector without ZeRO-1).
  Tensor first_moment() const { return m_; }
  Tensor second_moment() const { return v_; }
  Shard shard() const { return shard_; }
  bool sharded() const { return zero_stage_ >= 1 && world_ > 1; }
  int zero_stage() const { return zero_stage_; }
  // ZeRO-1 with separate FP32 master weights: this rank's shard of them, which the model keeps
  // (MasterRange, made with master_range()); else empty.
  Tensor master_shard() const { return model_.master_shard(); }
  // Bytes this rank holds for the optimizer: moments, plus the master shard it owns.
  size_t state_bytes() const { return m_.bytes() + v_.bytes() + (master_shard().empty() ? 0 : master_shard().bytes()); }
  // The range of the master weights a model must keep to be this optimizer's under ZeRO-1 to 3
  // with `world` ranks (all of them otherwise), whether it keeps grad buckets (ZeRO-2 and 3) and
  // whether it keeps only that range of its weights (ZeRO-3).
  static MasterRange master_range(int64_t num_params, int zero_stage, int rank, int world);

  // Elements of the gradient a bf16 exchange stages at once, over all ranks: 64 MiB of bf16,
  // few enough NCCL calls for an 8B model's gradients (a few hundred a step).
  static constexpr int64_t kWireChunk = int64_t{1} << 25;
  // kWireChunk, or $PTRAIN_GRAD_EXCHANGE_CHUNK (elements, for tests: many chunks of a small
  // model); a value that is not a positive integer is a UserError naming the variable.
  static int64_t wire_chunk();
  // The staging blocks' element counts for a model of shape s on `world` ranks (none on one
  // rank or with an FP32 exchange): the chunk every rank sends (under ZeRO-2 at most a grad
  // bucket, summed in place), and with ZeRO-1 the piece it receives.
  struct WireStaging {
    int64_t send = 0, receive = 0;
  };
  static WireStaging wire_staging(const ModelShape& s, int zero_stage, int world, GradReduceDtype wire);
  bool exchanges_bf16() const { return !wire_send_.empty(); }

 private:
  Tensor allocate(int64_t n, DType dtype, Format format);
  void reduce_in_bf16();
  // Primary FP8 weights under ZeRO-1 to 3: the ranks gather one another's codes, a byte each
  // where a layer's GEMMs are native and a dequantised float where it emulates them, so each
  // layer must be alike on every rank (ranks on unlike GPUs or libraries may differ): refused,
  // before any gather mixes them, with an EnvironmentError naming the first layer that is not
  // and the first rank that differs from rank 0 (and, on a rank that emulates it, why).
  void check_weight_codes_agree();

  Transformer& model_;
  Backend& backend_;
  AdamWConfig config_;
  Communicator* comm_;
  int zero_stage_;
  int world_ = 1;
  Shard shard_;
  Tensor m_, v_;           // FP32, the shard's (or the whole) flat layout
  // ZeRO-1: this rank's shard of the summed gradients, in the model's gradient buffer; ZeRO-2:
  // a buffer of its own, which the grad buckets are summed into.
  Tensor grad_shard_;
  // ZeRO-2: the bucket whose sum is on its way (reduce_grad_bucket), and where it goes.
  struct PendingBucket {
    int bucket = 0;
    bool first_micro_batch = false;
    int64_t at = 0;  // this rank's part of it begins here
  };
  std::optional<PendingBucket> pending_;
  void land_pending_bucket();
  // A bf16 exchange of grad bucket `bucket` (cut into `parts`): a chunk at a time rounded to bf16,
  // summed in place in bf16, and this rank's part widened back into the bucket.
  void reduce_bucket_in_bf16(int bucket, const std::vector<Shard>& parts);
  // Each rank's part of a bucket holding the flat layout's `ranges` in order (the parts a
  // reduce-scatter or all-gather of it takes).
  std::vector<Shard> parts_of(const std::vector<FlatRange>& ranges) const;
  // Fills `room` (the flat layout's `ranges`, in order) from every rank's shard: this rank's
  // pieces copied from where `kept` says it keeps them, then the parts all-gathered: started
  // only; the room is read after the communicator's wait_gathers().
  void gather_into(Tensor room, const std::vector<FlatRange>& ranges, const std::function<Tensor(FlatRange)>& kept);
  Tensor wire_send_, wire_receive_;  // bf16 exchange: the staged chunk, and (ZeRO-1) its summed piece
  std::vector<void*> memory_;
  int64_t t_ = 0;
};

}  // namespace ptrain
