#include "train/gpu_memory_plan.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "backend/cuda/arena_sizing.h"
#include "core/error.h"
#include "core/format.h"
#include "metrics/run_log.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "precision/policy.h"
#include "train/capacity_plan.h"

namespace ptrain {
namespace {

// The arena's block for `bytes` (none for none).
int64_t block(int64_t bytes) { return bytes > 0 ? static_cast<int64_t>(arena_block_bytes(static_cast<size_t>(bytes))) : 0; }
int64_t block_of(int64_t n, Format f) { return block(n * static_cast<int64_t>(dtype_size(cuda_storage_dtype(f)))); }

std::string gib(int64_t bytes) {
  return (bytes < 0 ? "-" : "") + gib_text(static_cast<size_t>(bytes < 0 ? -bytes : bytes));
}

// An FP8 model's blocks: the weights' own codes (kept the whole step, one per parameter) and
// the operands' (inputs, output gradients, the weights' transposes), most of them shared.
struct Fp8Bytes {
  int64_t weights = 0, operands = 0;
  int64_t total() const { return weights + operands; }
};

// Blocks that FP8 layers share, by what they hold, in the class they count in: ZeRO-3's weight
// codes by their shape (weights); the output gradient's by width ('g'), the inputs of the
// linears cast again before their backward pass by their slot in the block ('i', slot), the
// other inputs' forward codes by width ('i', -1), and the weight's transpose by its shape ('w',
// or 'T' beside shared codes) (operands).
struct SharedFp8Blocks {
  std::map<std::pair<int64_t, int64_t>, int64_t> weights;
  std::map<std::tuple<char, int64_t, int64_t>, int64_t> operands;
};

// Whether a linear layer's FP8 GEMMs run native on the CUDA backend (else Fp8Linear emulates).
bool native_fp8_linear(const Fp8Policy& policy, int64_t rows, int64_t C, int64_t OC) {
  return fp8_layer_problem(rows, C, OC, policy.recipe).empty() &&
         (policy.recipe != Fp8Recipe::block || policy.block == Fp8Linear::kNativeBlock);
}

// One FP8 linear layer's memory on the CUDA backend. Native FP8 GEMMs (CudaFp8Gemms) keep the
// codes of input (rows, C), weight (OC, C) and grad (rows, OC), one byte an element, with the
// transposes of input and grad, and their factors: one per tensor, or for block scaling one per
// 1x128 tile each way (the weight's: one per 128x128 block each way), and a few statistics
// blocks. The weight's transpose is shared by the layers of its shape (with WeightCodes::shared
// its whole set; with WeightCodes::handed the layer keeps no codes, only factors), the grad's
// set by the layers of its width, the input's codes by the layers of its width, and with
// `input_slot` >= 0 the input's whole set by the layers of that slot (`shared`). A layer cuBLASLt cannot take (dimensions off 16 elements, or blocks other than
// 128) emulates: FP32 copies in the model (Fp8Linear) and the backend's code, factor and FP32
// product scratch.
void add_fp8_linear(const Fp8Policy& policy, int64_t rows, int64_t C, int64_t OC, int input_slot,
                    Fp8Gemms::WeightCodes weight, SharedFp8Blocks& shared, Fp8Bytes& bytes) {
  const bool blocks = policy.recipe == Fp8Recipe::block;
  const bool native = native_fp8_linear(policy, rows, C, OC);
  const int64_t f32 = sizeof(float);
  const bool handed = weight == Fp8Gemms::WeightCodes::handed;
  if (!native) {  // Fp8Linear's dequantised copies: the weight (unless handed), then input and grad (twice for blocks)
    if (!handed) bytes.weights += block(OC * C * f32);
    bytes.operands += (blocks ? 2 : 1) * (block(rows * C * f32) + block(rows * OC * f32)) +
                      block(rows * std::max(C, OC)) + block(rows * OC * f32);
    return;
  }
  // The factors of a (r, c) operand's codes and, with block scaling, of its transpose, in
  // cuBLASLt's layouts (backend/cuda/matmul.h, gemm_scale_floats): the weight's 128x128 blocks
  // along K rounded up to 4, the others' 1x128 tiles with the outer length rounded up to 4.
  const auto up = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  const auto factors = [&](int64_t r, int64_t c, bool weight) {
    if (!blocks) return block(f32);
    if (weight) return block(up(r, 128) * up(up(c, 128), 4) * 4 * f32) + block(up(c, 128) * up(up(r, 128), 4) * 4 * f32);
    return block(up(c, 128) * up(r, 4) * 4 * f32) + block(up(r, 128) * up(c, 4) * 4 * f32);
  };
  const auto operand = [&](int64_t r, int64_t c) { return 2 * block(r * c) + factors(r, c, false); };
  shared.operands[{'g', OC, 0}] = operand(rows, OC);
  const int64_t weight_codes = block(OC * C) + factors(OC, C, true);
  if (weight == Fp8Gemms::WeightCodes::shared) {
    shared.weights[{OC, C}] = weight_codes;
    shared.operands[{'T', OC, C}] = block(OC * C);
  } else {
    shared.operands[{'w', OC, C}] = block(OC * C);
    bytes.weights += handed ? factors(OC, C, true) : weight_codes;
  }
  bytes.weights += block(4 * 64) + block(f32);  // the statistics, the current amax
  if (input_slot >= 0) {
    shared.operands[{'i', input_slot, 0}] = operand(rows, C);
  } else {  // the transpose and factors kept for wgrad; the codes shared
    shared.operands[{'i', -1, C}] = block(rows * C);
    bytes.operands += block(rows * C) + factors(rows, C, false);
  }
}

// ZeRO-3's weights on the rank that keeps the most (zero3_weights): its range and rooms in the
// weight format, and with primary FP8 weights each linear's codes (a byte each where its GEMMs
// are native, else dequantised floats).
int64_t zero3_weight_bytes(const ModelShape& s, const PrecisionPolicy& policy, int64_t rows, int world) {
  const bool primary = policy.fp8.enabled && policy.fp8.primary_weights;
  const auto linears = block_linear_shapes(s);
  std::array<int64_t, kLinearsPerBlock> code_bytes{};
  for (int k = 0; k < kLinearsPerBlock; ++k)
    code_bytes[k] = native_fp8_linear(policy.fp8, rows, linears[k][0], linears[k][1]) ? 1 : int64_t(sizeof(float));
  // The rooms are every rank's; the ranges differ in what they keep as codes (rank 0's is the
  // longest, and all that counts without codes).
  const Zero3Weights z = zero3_weights(s, primary, 0, 0);
  int64_t rooms = block_of(z.rooms, policy.weights);
  for (int k = 0; k < kLinearsPerBlock && primary; ++k) rooms += block(z.code_rooms[k] * code_bytes[k]);
  const std::array<FlatRange, kLinearsPerBlock> kept_as_codes = block_linear_ranges(s);
  int64_t most = 0;
  for (int r = 0; r < (primary ? world : 1); ++r) {
    const Shard range = shard_of(param_count(s), r, world);
    int64_t copy = range.count, codes = 0;
    for (int k = 0; k < kLinearsPerBlock && primary; ++k) {
      const int64_t c = overlap(kept_as_codes[k], range.begin, range.count);
      copy -= c;
      codes += block(c * code_bytes[k]);
    }
    most = std::max(most, block_of(copy, policy.weights) + codes);
  }
  return rooms + most;
}

// `sharded_params`: ZeRO-3, whose block linears cast their weights before each pass into codes
// they share, or with primary FP8 weights are handed their codes from the code rooms (counted
// with the weights: zero3_weight_bytes).
Fp8Bytes fp8_bytes(const ModelShape& s, const PrecisionPolicy& policy, int64_t rows, Recompute recompute,
                   bool fp8_throughout, bool sharded_params) {
  Fp8Bytes bytes;
  if (!policy.fp8.enabled) return bytes;
  SharedFp8Blocks shared;
  const auto linears = block_linear_shapes(s);
  using WeightCodes = Fp8Gemms::WeightCodes;
  const WeightCodes weight = fp8_weights_recast(policy, sharded_params)           ? WeightCodes::shared
                             : sharded_params && policy.fp8.primary_weights ? WeightCodes::handed
                                                                            : WeightCodes::own;
  const bool mlp_codes = keeps_mlp_input_codes(policy, recompute, fp8_throughout);
  for (int l = 0; l < s.n_layer; ++l)
    if (policy.fp8_block(l, s.n_layer))
      for (int k = 0; k < static_cast<int>(linears.size()); ++k)
        add_fp8_linear(policy.fp8, rows, linears[k][0], linears[k][1], fp8_input_slot(recompute, k, mlp_codes), weight, shared,
                       bytes);
  if (!policy.fp8.bf16_lm_head)
    add_fp8_linear(policy.fp8, rows, s.n_embd, s.padded_vocab, -1, WeightCodes::own, shared, bytes);
  for (const auto& [shape, shared_bytes] : shared.weights) bytes.weights += shared_bytes;
  for (const auto& [what, shared_bytes] : shared.operands) bytes.operands += shared_bytes;
  return bytes;
}

}  // namespace

GpuMemoryPlan plan_gpu_memory(const RunSpec& spec, const DistributedConfig& distributed, AttentionPath attention) {
  const int zero_stage = distributed.zero_stage;
  const ModelShape& s = spec.shape;
  // The phases store weights, activations and gradients alike (bf16 or fp8's bf16): the first's.
  const PrecisionPolicy& policy = spec.precision.phases.front().policy;
  const int B = spec.batch.micro_batch, T = spec.batch.seq_len, world_size = spec.batch.world_size;
  const int64_t n = param_count(s);
  GpuMemoryPlan p;
  p.parameters = n;
  p.cudnn_workspace_unknown = attention == AttentionPath::fused;
  // Transformer: flat parameters, the FP32 main gradients, FP32 master weights where the GEMMs'
  // copy is narrower (primary FP8 weights: none of the block linears'), one block of
  // activations, and the FP8 layers' codes.
  p.params = block_of(n - primary_fp8_weight_count(s, policy), policy.weights);
  p.grads = block_of(n, Format::fp32);
  if (policy.has_master_weights()) p.master = block_of(n, Format::fp32);
  // The MLP's pre-activation kept as FP8 codes counts among the activations it replaces.
  const bool mlp_codes = keeps_mlp_input_codes(policy, spec.recompute, spec.fp8_throughout);
  p.activations = block(model_activation_bytes(s, B, T, policy.activations, policy.activation_grads, attention,
                                             cuda_storage_dtype, spec.recompute, spec.fp8_throughout, mlp_codes)) +
                  (s.arch == Arch::llama ? block(rope_table_bytes(s, T)) : 0);
  if (mlp_codes)
    p.activations += static_cast<int64_t>(fp8_activation_store_bytes(s.n_layer, int64_t{B} * T,
                                                                     block_linear_shapes(s)[kFc][1], kFp8StoreTile));
  // A precision schedule makes its FP8 layers at its switches, in the room the widest phase needs.
  for (const auto& phase : spec.precision.phases) {
    const Fp8Bytes fp8 = fp8_bytes(s, phase.policy, int64_t{B} * T, spec.recompute, spec.fp8_throughout,
                                   zero_stage == 3 && world_size > 1);
    if (fp8.total() > p.fp8_weights + p.fp8_operands) {
      p.fp8_weights = fp8.weights;
      p.fp8_operands = fp8.operands;
    }
  }
  // AdamW: the moments of this rank's shard. With ZeRO-1 the model keeps only the shard's FP32
  // master weights, from the start (Transformer::MasterRange), and the gradients are summed into
  // the shard's part of the gradient block itself. ZeRO-2's model keeps the grad buckets (one
  // block's gradients and the other tensors') in place of the gradient block, and AdamW the
  // gradient shard they are summed into; ZeRO-3's its range of the weights and their rooms.
  const bool sharded = zero_stage >= 1 && world_size > 1;
  const int64_t shard = sharded ? (n + world_size - 1) / world_size : n;
  p.optimizer = 2 * block_of(shard, Format::fp32);
  if (sharded && policy.has_master_weights()) p.master = block_of(shard, Format::fp32);
  const GradBucketSizes buckets = grad_bucket_sizes(s);
  if (sharded && zero_stage >= 2)
    p.grads = block_of(buckets.total(), Format::fp32) + block_of(shard, Format::fp32);
  // ZeRO-3: this rank's range of the weights, and the rooms they are gathered into (laid out as
  // the grad buckets), at the rank that keeps the most.
  if (sharded && zero_stage == 3) {
    p.params = zero3_weight_bytes(s, policy, B * int64_t{T}, world_size);
    // (an FP8 LM head's codes are its own, and keep the class's name)
    p.fp8_codes_in_weights = policy.fp8.enabled && policy.fp8.primary_weights && policy.fp8.bf16_lm_head;
  }
  // The backend's own blocks, the trainer's per-micro-batch loss sums and a bf16 gradient
  // exchange's staging blocks.
  const AdamW::WireStaging wire = AdamW::wire_staging(s, zero_stage, world_size, distributed.grad_reduce_dtype);
  p.backend = static_cast<int64_t>(kBackendFixedBytes) + block(spec.batch.accumulation * int64_t(sizeof(double))) +
              block_of(wire.send, Format::bf16) + block_of(wire.receive, Format::bf16);
  // The ops' scratch, kept between calls (cuda_backend_impl.h, enum Slot), at its largest:
  const int64_t rows = int64_t{B} * T, C = s.n_embd, act = dtype_size(cuda_storage_dtype(policy.activations));
  int64_t scratch = 0;
  if (attention == AttentionPath::fused) {
    scratch += block(rows * 3 * C * act);  // dq, dk, dv before they are added into dqkv
  } else {
    // q, k, v, y and their gradients per head, and the attention matrix's gradient
    scratch += 7 * block(rows * C * act) + block(int64_t{B} * s.n_head * T * T * act);
  }
  // The layernorm and bias gradients' partial sums: one row per 32 rows of the widest (the fc
  // layer's bias, 4C).
  scratch += block((rows + 31) / 32 * 4 * C * int64_t(sizeof(float)));
  p.backend += scratch;
  return p;
}

AttentionPath expected_gpu_attention(const RunSpec& spec, AttentionRequest want) {
  const Format activations = spec.precision.phases.front().policy.activations;
  const bool half = activations == Format::bf16 || activations == Format::fp16;
  if (!half && want == AttentionRequest::cudnn)  // as the CUDA backend refuses it
    throw UserError("model.attention: cudnn cannot run this model: cuDNN's flash attention takes bf16 or fp16; this "
                    "run's activations are f32");
  return half && want != AttentionRequest::fallback ? AttentionPath::fused : AttentionPath::fallback;
}

std::string GpuMemoryPlan::describe() const {
  std::string text = format_mib(total()) + " = " + format_mib(params) + " params";
  const auto add = [&](int64_t bytes, const char* what) {
    if (bytes > 0) text += " + " + format_mib(bytes) + " " + what;
  };
  add(master, "FP32 master weights");
  add(grads, "FP32 grads");
  add(optimizer, "AdamW state");
  add(fp8_weights, fp8_codes_in_weights ? "FP8 weight scales" : "FP8 weight codes");
  add(activations, "activations");
  add(fp8_operands, "FP8 operand codes");
  add(backend, "backend workspace and scratch");
  if (cudnn_workspace_unknown) text += " + cuDNN's attention workspace (known on the GPU: a few MiB on small shapes)";
  return text;
}

std::string GpuMemoryPlan::describe_per_parameter() const {
  const auto per = [&](int64_t bytes) { return format_number("%.2f", static_cast<double>(bytes) / parameters); };
  std::string text = "bytes per parameter (" + format_thousands(static_cast<double>(parameters)) + "): weights " +
                     per(params);
  const auto add = [&](int64_t bytes, const char* what) {
    if (bytes > 0) text += " + " + std::string(what) + " " + per(bytes);
  };
  add(master, "FP32 master");
  add(grads, "FP32 grads");
  add(optimizer, "AdamW state");
  add(fp8_weights, fp8_codes_in_weights ? "FP8 weight scales" : "FP8 weight codes");
  text += " = " + per(model_state()) + " without activations";
  add(activations, "activations");
  add(fp8_operands, "FP8 operand codes");
  add(backend, "backend");
  return text + " = " + per(total()) + " per rank";
}

std::string describe_gpu_fit(const GpuMemoryPlan& plan, const std::string& device_name, int64_t device_total) {
  std::vector<GpuKind> gpus = known_gpus();
  if (device_total > 0) gpus.insert(gpus.begin(), GpuKind{"", device_name, device_total});
  std::string text;
  for (const GpuKind& g : gpus) {
    // The arena is what is free at start less the margin; the CUDA context's own share of the
    // free memory (some hundreds of MiB) is known only on the device.
    const int64_t arena = gpu_arena_bytes(g.total_bytes);
    const bool fits = plan.total() <= arena;
    text += "  " + g.name + " (" + gib(g.total_bytes) + ", arena at most " + gib(arena) + "): " +
            (fits ? "fits, " + std::to_string(static_cast<int>(100.0 * plan.total() / arena)) + "% of the arena"
                  : "does not fit: " + gib(plan.total() - arena) + " over; lower training.micro_batch") +
            "\n";
  }
  return text;
}

}  // namespace ptrain
