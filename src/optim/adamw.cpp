#include "optim/adamw.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace ptrain {

AdamW::AdamW(Transformer& model, Backend& backend, const AdamWConfig& config, Communicator* comm, int zero_stage,
             GradReduceDtype wire)
    : model_(model), backend_(backend), config_(config), comm_(comm), zero_stage_(zero_stage) {
  PTRAIN_CHECK(zero_stage >= 0 && zero_stage <= 3, "AdamW: zero_stage must be 0, 1, 2 or 3");
  world_ = comm ? comm->world_size() : 1;
  PTRAIN_CHECK(model.has_grad_buckets() == (zero_stage >= 2 && world_ > 1) &&
                   model.has_sharded_params() == (zero_stage == 3 && world_ > 1),
               "AdamW: a model under ZeRO-2 keeps grad buckets, under ZeRO-3 sharded parameters too "
               "(AdamW::master_range), and only then");
  // The moments are stored as the FP32 gradients are (f32, or the CPU's compute dtype).
  const Tensor g = model.has_grad_buckets() ? model.grad_bucket(-1) : model.grads_flat();
  const int64_t n = model.num_params();
  shard_ = sharded() ? shard_of(n, comm->rank(), world_) : Shard{0, n};
  PTRAIN_CHECK(!model.has_master_weights() || sharded() == !model.master_shard().empty(),
               "AdamW: a model under ZeRO-1 keeps its shard of the master weights (AdamW::master_range), and only then");
  PTRAIN_CHECK(model.master_shard().empty() || model.master_shard().numel() == shard_.count,
               "AdamW: the model's master shard is not this rank's");
  if (sharded() && model.primary_fp8_weights()) check_weight_codes_agree();
  m_ = allocate(shard_.count, g.dtype, Format::fp32);
  v_ = allocate(shard_.count, g.dtype, Format::fp32);
  // ZeRO-1 sums the gradients into this rank's shard of the main-gradient buffer itself (an
  // in-place reduce-scatter, as Megatron's distributed optimizer does): no second gradient block.
  if (model.has_grad_buckets())
    grad_shard_ = allocate(shard_.count, g.dtype, Format::fp32);
  else if (sharded())
    grad_shard_ = model.grads_flat().range(shard_.begin, shard_.count);
  const WireStaging staging = wire_staging(model.shape(), zero_stage, world_, wire);
  const DType bf16 = backend.storage_for(Format::bf16, g.dtype);
  if (staging.send > 0) wire_send_ = allocate(staging.send, bf16, Format::bf16);
  if (staging.receive > 0) wire_receive_ = allocate(staging.receive, bf16, Format::bf16);
}

void AdamW::check_weight_codes_agree() {
  const std::vector<Transformer::PrimaryFp8Layer> layers = model_.primary_fp8_layers();
  // Which layers run native GEMMs: a bit per layer, 52 layers to a double (exactly), each
  // gathered from every rank.
  constexpr size_t kLayersPerWord = 52;
  for (size_t first = 0; first < layers.size(); first += kLayersPerWord) {
    uint64_t mine = 0;
    for (size_t i = first; i < std::min(layers.size(), first + kLayersPerWord); ++i)
      if (layers[i].fp8->native()) mine |= uint64_t{1} << (i - first);
    const std::vector<double> ranks = comm_->all_gather(static_cast<double>(mine));
    const uint64_t rank0 = static_cast<uint64_t>(ranks[0]);
    uint64_t differ = 0;  // the layers some rank runs otherwise than rank 0
    for (const double word : ranks) differ |= static_cast<uint64_t>(word) ^ rank0;
    if (differ == 0) continue;
    // The first such layer, and the first rank that runs it otherwise: every rank says the same.
    const int bit = __builtin_ctzll(differ);
    size_t other = 1;
    while (((static_cast<uint64_t>(ranks[other]) ^ rank0) >> bit & 1) == 0) ++other;
    const Fp8Linear& layer = *layers[first + static_cast<size_t>(bit)].fp8;
    const auto runs = [&](uint64_t word) {
      return (word >> bit) & 1 ? "runs its FP8 GEMMs natively (a byte per code)"
                               : "emulates its FP8 GEMMs (a float per code)";
    };
    std::string message = "precision.fp8.primary_weights: the ranks keep the codes of " + layer.weight_name() +
                          " unlike: on rank 0 it " + runs(rank0) + ", on rank " + std::to_string(other) + " it " +
                          runs(static_cast<uint64_t>(ranks[other])) + "; under ZeRO-" + std::to_string(zero_stage_) +
                          " the ranks gather one another's codes, so every rank needs the same GPU and libraries "
                          "(or set precision.fp8.primary_weights: false)";
    if (!layer.native())
      message += ". This rank (" + std::to_string(comm_->rank()) + ") emulates it: " + layer.native_fp8_absent();
    throw EnvironmentError(message);
  }
}

int64_t AdamW::wire_chunk() {
  constexpr const char* kVariable = "PTRAIN_GRAD_EXCHANGE_CHUNK";
  const char* text = std::getenv(kVariable);
  if (!text || !*text) return kWireChunk;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (*end != '\0' || errno != 0 || v < 1 || !std::isdigit(static_cast<unsigned char>(text[0])))
    throw UserError(std::string(kVariable) + ": \"" + text + "\" is not a chunk size; expected a positive integer "
                    "(elements), or unset");
  return v;
}

AdamW::WireStaging AdamW::wire_staging(const ModelShape& s, int zero_stage, int world, GradReduceDtype wire) {
  const int64_t n = param_count(s);
  if (wire != GradReduceDtype::bf16 || world <= 1 || n == 0) return {};
  const int64_t chunk = wire_chunk();
  if (zero_stage >= 2) {
    const GradBucketSizes b = grad_bucket_sizes(s);
    return {std::min(std::max({b.block, b.head, b.embedding}), chunk), 0};
  }
  if (zero_stage != 1) return {std::min(n, chunk), 0};
  // Each rank's piece of a chunk is the same length (a shorter shard's padded with zeros), so
  // the communicator's reduce-scatter of the chunk hands each rank its own piece.
  const int64_t piece = std::min((n + world - 1) / world, std::max<int64_t>(chunk / world, 1));
  return {piece * world, piece};
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
  if (zero_stage < 1 || world <= 1) return {};
  const Shard s = shard_of(num_params, rank, world);
  return {s.begin, s.count, zero_stage >= 2, zero_stage == 3};
}

double AdamW::reduce_gradients(bool summed_in_backward) {
  const Tensor grads = model_.grads_flat();
  PTRAIN_CHECK(!(summed_in_backward && exchanges_bf16()), "AdamW: a bf16 gradient exchange is not summed in backward");
  PTRAIN_CHECK(!pending_, "AdamW: a gradient bucket is still on its way (the embeddings' bucket lands last)");
  if (sharded()) {
    // ZeRO-2 summed the gradients bucket by bucket during the backward passes.
    if (!model_.has_grad_buckets() && exchanges_bf16())
      reduce_in_bf16();
    else if (!model_.has_grad_buckets())
      comm_->reduce_scatter_sum(grad_shard_, grads);
    return std::sqrt(comm_->all_reduce_sum(backend_.sum_squares(grad_shard_)));
  }
  if (world_ == 1) return std::sqrt(backend_.sum_squares(grads));
  if (exchanges_bf16())
    reduce_in_bf16();
  else if (summed_in_backward)
    comm_->wait();
  else
    comm_->all_reduce_sum(grads);
  // Each rank squares its ZeRO-1 shard of the summed gradients and the ranks add them, as ZeRO-1
  // does: both stages clip by the same norm, and a GPU syncs once.
  const Shard s = shard_of(grads.numel(), comm_->rank(), world_);
  return std::sqrt(comm_->all_reduce_sum(backend_.sum_squares(grads.range(s.begin, s.count))));
}

std::vector<Shard> AdamW::parts_of(const std::vector<FlatRange>& ranges) const {
  // Rank r's part of a bucket: its elements inside shard r, one run of the bucket since the
  // ranges ascend and each shard is one run of the flat layout.
  std::vector<Shard> parts;
  int64_t next = 0;
  for (int r = 0; r < world_; ++r) {
    const Shard s = shard_of(model_.num_params(), r, world_);
    int64_t count = 0;
    for (const FlatRange& f : ranges)
      count += std::max<int64_t>(0, std::min(f.begin + f.count, s.begin + s.count) - std::max(f.begin, s.begin));
    parts.push_back({next, count});
    next += count;
  }
  return parts;
}

void AdamW::gather_into(Tensor room, const std::vector<FlatRange>& ranges,
                        const std::function<Tensor(FlatRange)>& kept) {
  const std::vector<Shard> parts = parts_of(ranges);
  const Shard mine = parts[static_cast<size_t>(comm_->rank())];
  int64_t at = mine.begin;
  for (const FlatRange& f : ranges) {
    const int64_t lo = std::max(f.begin, shard_.begin), hi = std::min(f.begin + f.count, shard_.begin + shard_.count);
    if (lo >= hi) continue;
    backend_.copy(room.range(at, hi - lo), kept({lo, hi - lo}));
    at += hi - lo;
  }
  comm_->all_gather_async(room, room.range(mine.begin, mine.count), parts);
}

void AdamW::start_weight_gather(int bucket) {
  gather_into(model_.weight_room(bucket), model_.weight_room_ranges(bucket),
              [&](FlatRange f) { return model_.range_copy(f); });
  // A block's primary FP8 weights: the ranks' codes, a byte a parameter on a GPU.
  if (bucket < 0 || bucket >= model_.shape().n_layer) return;
  for (int k = 0; k < kLinearsPerBlock; ++k)
    if (const Tensor room = model_.code_room(bucket, k); !room.empty())
      gather_into(room, {model_.primary_layer_range(bucket, k)}, [&](FlatRange f) { return model_.range_codes(f); });
}

void AdamW::wait_weight_gathers() { comm_->wait_gathers(); }

void AdamW::reduce_grad_bucket(int bucket, bool first_micro_batch) {
  land_pending_bucket();
  const Tensor grads = model_.grad_bucket(bucket);
  const std::vector<Shard> parts = parts_of(model_.grad_bucket_ranges(bucket));
  const Shard mine = parts[static_cast<size_t>(comm_->rank())];
  if (exchanges_bf16())
    reduce_bucket_in_bf16(bucket, parts);
  else
    comm_->reduce_scatter_sum_async(grads.range(mine.begin, mine.count), grads, parts);  // in place
  pending_ = PendingBucket{bucket, first_micro_batch, mine.begin};
  if (bucket < 0 || exchanges_bf16()) land_pending_bucket();
}

void AdamW::reduce_bucket_in_bf16(int bucket, const std::vector<Shard>& parts) {
  const Tensor grads = model_.grad_bucket(bucket);
  const int64_t n = grads.numel();
  for (int64_t at = 0; at < n; at += wire_send_.numel()) {
    const int64_t len = std::min(wire_send_.numel(), n - at);
    const Tensor chunk = wire_send_.range(0, len);
    backend_.copy(chunk, grads.range(at, len));
    // Each rank's part of the chunk: its part of the bucket cut to [at, at + len).
    std::vector<Shard> cut;
    for (const Shard& p : parts) {
      const int64_t lo = std::clamp(p.begin - at, int64_t{0}, len), hi = std::clamp(p.begin + p.count - at, int64_t{0}, len);
      cut.push_back({lo, hi - lo});
    }
    const Shard mine = cut[static_cast<size_t>(comm_->rank())];
    comm_->reduce_scatter_sum(chunk.range(mine.begin, mine.count), chunk, cut);
    if (mine.count > 0) backend_.copy(grads.range(at + mine.begin, mine.count), chunk.range(mine.begin, mine.count));
  }
}

void AdamW::land_pending_bucket() {
  if (!pending_) return;
  comm_->wait();
  const Tensor grads = model_.grad_bucket(pending_->bucket);
  // Each range's piece of this rank's part lands at its place in the gradient shard.
  int64_t at = pending_->at;
  for (const FlatRange& f : model_.grad_bucket_ranges(pending_->bucket)) {
    const int64_t lo = std::max(f.begin, shard_.begin), hi = std::min(f.begin + f.count, shard_.begin + shard_.count);
    if (lo >= hi) continue;
    const Tensor dst = grad_shard_.range(lo - shard_.begin, hi - lo), src = grads.range(at, hi - lo);
    if (pending_->first_micro_batch)
      backend_.copy(dst, src);
    else
      backend_.add(dst, dst, src);
    at += hi - lo;
  }
  pending_.reset();
}

void AdamW::reduce_in_bf16() {
  const Tensor grads = model_.grads_flat();
  const int64_t n = grads.numel();
  if (!sharded()) {  // all-reduce, a chunk at a time
    for (int64_t at = 0; at < n; at += wire_send_.numel()) {
      const int64_t len = std::min(wire_send_.numel(), n - at);
      const Tensor wire = wire_send_.range(0, len);
      backend_.copy(wire, grads.range(at, len));
      comm_->all_reduce_sum(wire);
      backend_.copy(grads.range(at, len), wire);
    }
    return;
  }
  // Reduce-scatter: chunk k holds piece k of every rank's shard, rank by rank, so that the
  // communicator's shard r of the chunk is piece k of shard r.
  const int64_t piece = wire_receive_.numel(), longest = shard_of(n, 0, world_).count;
  for (int64_t at = 0; at < longest; at += piece) {
    const int64_t len = std::min(piece, longest - at);
    const Tensor chunk = wire_send_.range(0, len * world_);
    backend_.zero(chunk);  // a shorter shard's piece is padded with zeros
    for (int r = 0; r < world_; ++r) {
      const Shard s = shard_of(n, r, world_);
      const int64_t count = std::min(len, s.count - at);
      if (count > 0) backend_.copy(chunk.range(r * len, count), grads.range(s.begin + at, count));
    }
    comm_->reduce_scatter_sum(wire_receive_.range(0, len), chunk);
    const int64_t mine = std::min(len, shard_.count - at);
    if (mine > 0) backend_.copy(grad_shard_.range(at, mine), wire_receive_.range(0, mine));
  }
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
  // Under ZeRO-3 the GEMMs' copy holds that range only.
  const Tensor params = model_.params_flat();
  const bool own_range = model_.has_sharded_params();
  const Tensor master = !master_shard().empty() ? master_shard()
                        : own_range              ? params
                        : sharded()              ? params.range(shard_.begin, shard_.count)
                                                 : model_.master_flat();
  const Tensor grads = sharded() ? grad_shard_ : model_.grads_flat();
  // Walk the parameter tensors that overlap the range: weight decay applies to 2-D weights only.
  // The update also writes the GEMMs' copy where one is kept apart from the master (primary FP8
  // weights keep none: gather_primary_fp8_weights casts them).
  int64_t offset = 0;
  for (const ParamSpec& spec : model_.specs()) {
    const int64_t n = shape_numel(spec.shape);
    const int64_t lo = std::max(offset, shard_.begin), hi = std::min(offset + n, shard_.begin + shard_.count);
    if (lo < hi) {
      const int64_t local = lo - shard_.begin, len = hi - lo;
      // ZeRO-3's copy is this rank's range of params_flat (but for primary FP8 weights, whose
      // codes gather_primary_fp8_weights casts).
      const Tensor copy = own_range ? (model_.has_master_weights() && !model_.is_primary_fp8(spec.id)
                                           ? model_.range_copy({lo, len})
                                           : Tensor())
                          : model_.weight_copy(spec.id).empty() ? Tensor()
                                                                : model_.weight_copy(spec.id).range(lo - offset, len);
      p.weight_decay = spec.weight_decay ? static_cast<float>(config_.weight_decay) : 0.0f;
      backend_.adamw(master.range(local, len), grads.range(local, len), m_.range(local, len), v_.range(local, len),
                     p, copy);
    }
    offset += n;
  }
  if (!sharded() || own_range) return;
  // The ranks' updated copies, all-gathered: the whole flat layout at once, or with primary FP8
  // weights (whose copies leave the block linears out) each other tensor's in place.
  if (!model_.primary_fp8_weights()) {
    comm_->all_gather(params, params.range(shard_.begin, shard_.count));
    return;
  }
  offset = 0;
  for (const ParamSpec& spec : model_.specs()) {
    const int64_t n = shape_numel(spec.shape);
    const Tensor copy = model_.weight_copy(spec.id);
    if (!copy.empty()) {
      const std::vector<Shard> parts = parts_of({FlatRange{offset, n}});
      const Shard mine = parts[static_cast<size_t>(comm_->rank())];
      comm_->all_gather(copy.range(0, n), copy.range(mine.begin, mine.count), parts);
    }
    offset += n;
  }
}

void AdamW::gather_primary_fp8_weights(bool training) {
  if (!sharded() || !model_.primary_fp8_cast_due(training)) return;
  const Tensor master = master_shard();
  // This rank's part of a run of the flat layout: its place in the run and in the shard.
  struct Part {
    int64_t in_run = 0, in_shard = 0, count = 0;
  };
  const auto part_of = [&](const FlatRange& f) {
    const int64_t lo = std::max(f.begin, shard_.begin), hi = std::min(f.begin + f.count, shard_.begin + shard_.count);
    return lo < hi ? Part{lo - f.begin, lo - shard_.begin, hi - lo} : Part{};
  };
  // Each rank casts its part of every layer's weight with the scales the ranks agree on (one
  // max over the ranks' amaxes for all layers), and the codes are all-gathered into each
  // layer (under ZeRO-3 each rank keeps its part's, and the passes gather them): 1 byte a
  // parameter on a GPU where the FP32 master would be 4, and the codes, scales and statistics
  // are the bits one rank's cast of the whole makes.
  const std::vector<Transformer::PrimaryFp8Layer> layers = model_.primary_fp8_layers();
  std::vector<size_t> first_amax;
  std::vector<float> amaxes;
  for (const auto& layer : layers) {
    first_amax.push_back(amaxes.size());
    amaxes.resize(amaxes.size() + static_cast<size_t>(layer.fp8->weight_amax_count()), 0.0f);
    const Part p = part_of(layer.range);
    if (p.count > 0)
      layer.fp8->weight_part_amaxes(master.range(p.in_shard, p.count), p.in_run, amaxes.data() + first_amax.back());
  }
  comm_->all_reduce_max(amaxes.data(), amaxes.size());
  std::vector<double> counts;  // each layer's nonzero, underflow and saturated counts
  for (size_t i = 0; i < layers.size(); ++i) {
    Fp8Linear& fp8 = *layers[i].fp8;
    fp8.agree_weight_scales(amaxes.data() + first_amax[i], training);
    const Part p = part_of(layers[i].range);
    const Tensor part = master.range(p.in_shard, p.count);
    Fp8CastStats s;
    if (model_.has_sharded_params()) {  // ZeRO-3: each rank keeps its part's codes, the passes gather them
      if (p.count > 0) s = fp8.encode_weight_part(part, p.in_run, model_.range_codes({shard_.begin + p.in_shard, p.count}));
    } else {  // into the layer's codes, gathered beside the next layer's cast on GPUs
      if (p.count > 0) s = fp8.encode_weight_part(part, p.in_run);
      const Tensor codes = fp8.weight_codes();
      comm_->all_gather_async(codes, codes.range(p.in_run, p.count), parts_of({layers[i].range}));
    }
    counts.insert(counts.end(), {static_cast<double>(s.nonzero), static_cast<double>(s.underflow),
                                 static_cast<double>(s.saturated)});
  }
  comm_->wait_gathers();
  comm_->all_reduce_sum(counts.data(), counts.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    Fp8CastStats all;
    all.nonzero = static_cast<int64_t>(counts[3 * i]);
    all.underflow = static_cast<int64_t>(counts[3 * i + 1]);
    all.saturated = static_cast<int64_t>(counts[3 * i + 2]);
    layers[i].fp8->finish_weight_cast(all, training);
  }
  model_.finish_primary_fp8_cast(training);
}

std::vector<float> AdamW::master_on_main() const {
  const bool main = !comm_ || comm_->rank() == 0;
  const int64_t n = model_.num_params();
  std::vector<float> out(main ? static_cast<size_t>(n) : 0);
  // ZeRO-3 in fp32 keeps no master apart: its range of the weights is the values.
  const Tensor values = !master_shard().empty() ? master_shard() : model_.has_sharded_params() ? model_.params_flat()
                                                                                               : Tensor();
  if (!values.empty()) {
    std::vector<float> shard(static_cast<size_t>(shard_.count));
    backend_.download(shard.data(), values);
    comm_->gather_shards(main ? out.data() : nullptr, shard.data(), n);
  } else if (main) {
    backend_.download(out.data(), model_.master_flat());
  }
  return out;
}

}  // namespace ptrain
