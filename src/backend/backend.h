// The Backend interface: every numeric operation of the model goes through it, so the model
// is written once (src/model) and runs on the CPU reference (backend/cpu) or on CUDA (backend/cuda).
//
// Conventions shared by all ops:
//  - Shapes use B (batch), T (sequence), C (channels), OC (output channels), NH (heads),
//    V (real vocabulary) and Vp (padded vocabulary). Ops check dtypes and shapes.
//  - Linear weights are stored (OC, C) row-major, as in PyTorch and llm.c.
//  - Backward ops ADD into every gradient output (+=), so parameter gradients accumulate
//    across micro-batches and the residual stream's gradient accumulates across branches.
//    Callers zero scratch gradients before use.
//  - Reductions run in a fixed order that does not depend on the thread count, so results
//    are bit-identical run to run and across thread counts.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/choices.h"
#include "core/error.h"
#include "core/tensor.h"
#include "backend/fp8_activation_store.h"
#include "backend/op_profile.h"

namespace ptrain {

// Gradient values that rounding to a reduced-precision format flushed to zero, counted by the
// backward ops as they write gradients (telemetry: "how much signal did fp16 lose?").
struct GradNumerics {
  int64_t elements = 0;   // gradient elements written in a reduced-precision format
  int64_t nonzero = 0;    // of those, non-zero values the rounding changed (not already on the grid)
  int64_t underflow = 0;  // of those, the ones rounded to zero
};

// What an FP8 cast did to one tensor.
struct Fp8CastStats {
  float amax = 0;         // max |x| before scaling (NaN if any element is NaN)
  int64_t nonzero = 0;    // non-zero inputs
  int64_t underflow = 0;  // non-zero inputs that became zero
  int64_t saturated = 0;  // inputs whose scaled value overflowed the format and was clipped to max

  // Adds another cast's (or casts') statistics: amax the NaN-sticky max, counts summed.
  void merge(const Fp8CastStats& s) {
    amax = std::isnan(s.amax) || std::isnan(amax) ? NAN : std::max(amax, s.amax);
    nonzero += s.nonzero;
    underflow += s.underflow;
    saturated += s.saturated;
  }
};

// How attention saves its forward pass for the backward pass.
enum class AttentionPath {
  fallback,  // GEMMs + softmax kernels, saving the probabilities (B,NH,T,T): every backend, every dtype
  fused,     // cuDNN flash attention (bf16/fp16), saving one FP32 log-sum-exp per row (B,NH,T)
};
struct AttentionChoice {
  AttentionPath path = AttentionPath::fallback;
  std::string reason;  // for the run log, e.g. "cudnn (fused flash attention, cuDNN 9.19.0)"
};

struct AdamWParams {
  float lr = 0;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0;
  float grad_scale = 1;  // multiplies the gradient first (clipping; later loss-scale removal)
  int64_t step = 1;      // 1-based, for bias correction
};

// Native FP8 GEMMs of one linear layer (a GPU with FP8 tensor cores): the backend casts each
// operand to FP8 codes and keeps what the GEMMs read (the codes, their transpose, the
// dequantisation factors; the weight's transpose is made from its codes when the dgrad GEMM
// needs it); the three GEMMs then read the codes directly, with FP32
// accumulation. The CPU has none: it emulates with fp8_cast (dequantised values) and matmul.
class Fp8Gemms {
 public:
  enum Operand { kInput, kWeight, kGrad };  // (rows, C), (OC, C), (rows, OC)
  // How the factors are given: one per tensor (delayed and current recipes), or one per 1x128
  // tile / 128x128 block (the block recipe: Hopper's block-scaled GEMMs).
  enum class Scaling { tensor, blocks };
  // Where the weight's codes live: the layer's own, cast once a step; shared with the other
  // layers of its shape, each casting its weight right before each forward() and backward()
  // (ZeRO-3's, gathered into a room for each pass); or handed to the GEMMs before each pass
  // (bind_weight_codes: ZeRO-3's primary FP8 weights, gathered as codes). The factors are the
  // layer's own but when shared.
  enum class WeightCodes { own, shared, handed };
  // What an operand's recorded casts did, and the scale of the latest one: NaN with block
  // scaling, 0 if there was none since the last take_stats().
  struct OperandStats {
    Fp8CastStats stats;
    float scale = 0;
  };
  virtual ~Fp8Gemms() = default;

  // The casts queue on the device and return at once: each operand's statistics gather there
  // (amax the NaN-sticky max, counts summed) until take_stats() reads them, so a step's casts
  // never wait for the GPU. `record` false (an evaluation's cast) leaves them out.
  //   Scaling::tensor, with a scale the host chose (delayed scaling).
  virtual void cast(Operand which, Tensor in, Format format, float scale, bool record) = 0;
  //   Scaling::tensor, with scale fp8_max / amax(in) found on the device (current scaling).
  virtual void cast_current(Operand which, Tensor in, Format format, bool record) = 0;
  //   Scaling::blocks: blocks of block_rows x block_cols, each with scale fp8_max / amax(block),
  //   as Backend::fp8_cast_blocks does. The layer's tilings: 128x128 for the weight; 1x128 for
  //   input and grad (forward and dgrad GEMMs); 128x1 for input and grad again (the wgrad GEMM,
  //   which contracts over tokens).
  virtual void cast_blocks(Operand which, Tensor in, Format format, int block_rows, int block_cols, bool record) = 0;
  // The recorded casts' statistics per operand since the last call (one read from the device),
  // which then start again from zero.
  virtual std::array<OperandStats, 3> take_stats() = 0;
  // Starts take_stats()'s read without waiting for it. Starting every layer's read before taking
  // any makes the end of a step wait for the device once, not once per layer.
  virtual void queue_stats_read() {}

  // The weight's codes as the GEMMs read them, (OC, C) (u8 on a GPU; dequantised floats where
  // the codes are emulated), and the scales they were cast with
  // (one, or one per 128x128 block row-major): for codes written elsewhere than by a cast
  // (primary FP8 weights' codes all-gathered under ZeRO, each rank casting its part:
  // Backend::fp8_encode). Nothing is recorded in the statistics.
  virtual Tensor weight_codes() = 0;
  virtual void set_weight_scales(Format format, const std::vector<float>& scales) = 0;
  // WeightCodes::handed: the codes the next forward() and backward() read, (OC, C) u8, cast
  // with the scales set_weight_scales gave.
  virtual void bind_weight_codes(Tensor codes) {
    (void)codes;
    PTRAIN_CHECK(false, "bind_weight_codes: these FP8 GEMMs keep their weight's codes themselves");
  }

  // out(rows, OC) = input weight^T + bias (bias may be empty).
  virtual void forward(Tensor out, Tensor bias) = 0;
  // dinp(rows, C) += grad weight; dweight(OC, C) += grad^T input. Either may be empty.
  virtual void backward(Tensor dinp, Tensor dweight) = 0;
};

// Work recorded by Backend::record, replayed in the stream order of the backend's other ops.
class RecordedWork {
 public:
  virtual ~RecordedWork() = default;
  virtual void replay() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  // One line for the run log: the device, threads, libraries.
  virtual std::string description() const = 0;
  // Problems with the environment that cost speed (not correctness), for the run log.
  virtual std::vector<std::string> performance_warnings() const = 0;

  // Each op writes its outputs rounded to their Tensor::format (ties to even; bf16 and fp16
  // overflow to inf, which loss scaling detects).

  // How a tensor of `format` is stored when the model computes in `compute` (f32, or f64 for
  // gradient checks): the CPU emulates every format in `compute`; a GPU stores bf16 and fp16 as such.
  virtual DType storage_for(Format format, DType compute) const = 0;

  // Memory. allocate() returns zeroed memory aligned to 64 bytes.
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* ptr) = 0;
  virtual void zero(Tensor t) = 0;
  // Host float data in and out, converting to/from the tensor's dtype.
  virtual void upload(Tensor dst, const float* src) = 0;
  virtual void download(float* dst, Tensor src) = 0;
  virtual void upload_tokens(Tensor dst, const int32_t* src) = 0;
  // dst = src rounded to dst.format (e.g. the bf16 copy of FP32 master weights); u8 (FP8 codes)
  // to u8 byte for byte.
  virtual void copy(Tensor dst, Tensor src) = 0;

  // out(B,T,C) = wte[tokens] + wpe[t]; tokens (B,T) i32. An empty wpe (dwpe): no position
  // embedding (llama, whose positions are RoPE's), out = wte[tokens].
  virtual void embedding_forward(Tensor out, Tensor tokens, Tensor wte, Tensor wpe) = 0;
  virtual void embedding_backward(Tensor dwte, Tensor dwpe, Tensor dout, Tensor tokens) = 0;

  // out(N,C) = (inp - mean) * rstd * weight + bias, per row; saves mean(N), rstd(N).
  virtual void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor inp, Tensor weight,
                                 Tensor bias) = 0;
  virtual void layernorm_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout,
                                  Tensor inp, Tensor weight, Tensor mean, Tensor rstd) = 0;

  // out(N,OC) = inp(N,C) weight(OC,C)^T + bias(OC); bias may be empty.
  virtual void matmul_forward(Tensor out, Tensor inp, Tensor weight, Tensor bias) = 0;
  // Any of dinp, dweight, dbias may be empty (that gradient is not computed).
  virtual void matmul_backward(Tensor dinp, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp,
                               Tensor weight) = 0;
  // dbias(OC) += column sums of dout(N, OC).
  virtual void bias_backward(Tensor dbias, Tensor dout) = 0;

  // Causal multi-head self-attention. qkv (B,T,W) holds q's heads, then k's and v's
  // (attention_heads.h: W = 3C for GPT-2, fewer K/V heads for grouped-query attention); out (B,T,C).
  // `saved` keeps what the backward pass needs, and its shape says which path runs (see
  // AttentionPath): the softmax probabilities (B,NH,T,T), or one FP32 log-sum-exp per row
  // (B,NH,T) for the fused path, which recomputes the probabilities from qkv and out.
  virtual void attention_forward(Tensor out, Tensor saved, Tensor qkv, int n_head) = 0;
  virtual void attention_backward(Tensor dqkv, Tensor dout, Tensor qkv, Tensor out, Tensor saved,
                                  int n_head) = 0;
  // One query over cached keys and values, for incremental decoding (a KV cache): qkv (T,W)
  // holds rows 0..T-1 of one sequence, and out (C) = causal attention at its last row, what
  // attention_forward writes at that row, at O(T) cost. Saves nothing: decoding has no backward.
  virtual void attention_decode(Tensor out, Tensor qkv, int n_head) = 0;
  // Which attention path runs for this shape, given model.attention (`want`) and the activations'
  // storage dtype, with n_kv_head K/V heads (n_head: multi-head). Throws UserError, saying why,
  // when cudnn is asked for and cannot run here.
  virtual AttentionChoice choose_attention(AttentionRequest want, DType dtype, int64_t B, int64_t T, int n_head,
                                           int n_kv_head, int64_t head_size) = 0;

  // GELU, tanh approximation.
  virtual void gelu_forward(Tensor out, Tensor inp) = 0;
  virtual void gelu_backward(Tensor dinp, Tensor inp, Tensor dout) = 0;

  // The MLP's GELU together with the GEMM beside it. A GPU backend folds the GELU into the
  // GEMM's epilogue (one pass less over the (N, 4C) activations each way); these defaults run
  // the separate ops, so a backend without such GEMMs computes exactly what they do.
  //   forward:  pre = inp weight^T + bias, out = gelu(pre).
  virtual void matmul_gelu_forward(Tensor out, Tensor pre, Tensor inp, Tensor weight, Tensor bias) {
    matmul_forward(pre, inp, weight, bias);
    gelu_forward(out, pre);
  }
  //   backward of y = gelu(pre) weight^T + bias, where inp = gelu(pre): dpre = gelu'(pre) *
  //   (dout weight) (written, not added), dweight += dout^T inp, dbias += column sums of dout.
  //   `dgelu` (pre's shape) is scratch for the gradient at the GELU's output; a fusing backend
  //   leaves it alone.
  virtual void matmul_gelu_backward(Tensor dpre, Tensor dweight, Tensor dbias, Tensor dout, Tensor inp, Tensor weight,
                                    Tensor pre, Tensor dgelu) {
    zero(dgelu);
    matmul_backward(dgelu, dweight, dbias, dout, inp, weight);
    zero(dpre);
    gelu_backward(dpre, pre, dgelu);
  }

  // The ops of a Llama-style block.
  //   RMSNorm: out(N,C) = inp * rstd * weight per row, rstd(N) = 1 / sqrt(mean(inp^2) + eps),
  //   saved for the backward pass in the statistics' format (FP32 on a GPU; the CPU keeps its
  //   compute dtype, f32 or f64). dinp must not alias dout.
  virtual void rmsnorm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor weight, float eps) = 0;
  virtual void rmsnorm_backward(Tensor dinp, Tensor dweight, Tensor dout, Tensor inp, Tensor weight, Tensor rstd) = 0;
  //   QK-norm (model.qk_norm): RMSNorm over each head of q and of k in qkv rows (..., W), W =
  //   (n_head + 2 n_kv_head) hs, q's heads by q_weight (hs), k's by k_weight (hs); v's heads are
  //   copied (forward) or their gradient added (backward). rstd (N n_head + N n_kv_head) for N
  //   rows: q's heads first, then k's, in the statistics' format. out may be inp; dinp must not
  //   alias dout.
  virtual void qk_norm_forward(Tensor out, Tensor rstd, Tensor inp, Tensor q_weight, Tensor k_weight, int n_head,
                               float eps) = 0;
  virtual void qk_norm_backward(Tensor dinp, Tensor dq_weight, Tensor dk_weight, Tensor dout, Tensor inp,
                                Tensor q_weight, Tensor k_weight, Tensor rstd, int n_head) = 0;
  //   Rotary position embeddings, rotate-half layout (Llama, Hugging Face): in the first `heads`
  //   heads of each row of x (B,T,width) (q's heads, then k's), element i < hs/2 of a head pairs
  //   with i + hs/2 and the pair turns by the angle whose cosine and sine table (T,hs/2,2), FP32,
  //   holds for the row's position (hs = 2 table.dim(1)). In place. The backward turns the
  //   gradient back, in place too: the one backward op that writes instead of adding, since the
  //   rotated tensor's gradient holds nothing else.
  virtual void rope_forward(Tensor x, Tensor table, int heads) = 0;
  virtual void rope_backward(Tensor dx, Tensor table, int heads) = 0;
  //   SwiGLU: out(N,H) = silu(gate) * up, each row of gate_up (N,2H) the gate projection's H
  //   values, then the up projection's.
  virtual void swiglu_forward(Tensor out, Tensor gate_up) = 0;
  virtual void swiglu_backward(Tensor dgate_up, Tensor dout, Tensor gate_up) = 0;

  // out = a + b, elementwise.
  virtual void add(Tensor out, Tensor a, Tensor b) = 0;

  // Softmax + cross-entropy over the first `vocab` columns of logits (N, Vp) in one pass:
  // losses(N) = -log softmax(logits)[target]. The logits are overwritten by their gradient
  // dloss * (softmax - onehot), padded columns zero (all zero when dloss = 0): no second copy
  // of the logits is ever kept.
  virtual void classifier(Tensor logits, Tensor losses, Tensor targets, int vocab, float dloss) = 0;

  // Sum, and sum of squares, of all elements, accumulated in double in a fixed order. For f32
  // storage the sum of squares is finite exactly when every element is (no float squares to
  // inf in double): loss scaling's overflow check.
  virtual double sum(Tensor t) = 0;
  virtual double sum_squares(Tensor t) = 0;
  // out (one f64 element in this backend's memory) = sum(t), the same value, left where it is:
  // results gathered this way are read together by one download_doubles, not one wait each.
  virtual void sum_into(Tensor out, Tensor t) = 0;
  // f64 elements to the host, exactly.
  virtual void download_doubles(double* dst, Tensor src) = 0;
  // max |x| (NaN if any element is NaN).
  virtual float amax(Tensor t) = 0;

  // FP8 casts. `out` receives the dequantised values fp8(in * scale) / scale (saturating), which
  // is what a GEMM with scale_inv pointers computes with; in and out have the same shape.
  virtual Fp8CastStats fp8_cast(Tensor out, Tensor in, Format format, float scale) = 0;
  // Block scaling: `in` viewed as rows x cols (cols = last dimension) in blocks of
  // block_rows x block_cols (1x128 tiles, 128x128 blocks), each with scale fp8_max / amax(block).
  virtual Fp8CastStats fp8_cast_blocks(Tensor out, Tensor in, Format format, int block_rows,
                                       int block_cols) = 0;
  // A part of a weight cast on several ranks, each its own part, with scales the ranks agreed on
  // (primary FP8 weights under ZeRO: Fp8Linear::encode_weight_part). `part` holds elements
  // [first, first + part.numel()) of a (rows, cols) tensor in row-major order.
  //   fp8_block_amaxes: amaxes[i * ceil(cols / block_cols) + j] = max(itself, max |x| over the
  //   part's elements of block (i, j)), NaN skipped as fp8_cast_blocks skips it (host array).
  virtual void fp8_block_amaxes(float* amaxes, Tensor part, int64_t first, int64_t cols, int block_rows,
                                int block_cols) = 0;
  //   fp8_encode: out = the part cast as fp8_cast casts it with scales[0], or as fp8_cast_blocks
  //   casts it with scales[block] (blocks numbered as above) when there are more; out holds the
  //   dequantised values (a float dtype), or on a GPU the FP8 codes themselves (u8). Returns the
  //   part's counts and amax.
  virtual Fp8CastStats fp8_encode(Tensor out, Tensor part, Format format, const std::vector<float>& scales,
                                  int64_t first, int64_t cols, int block_rows, int block_cols) = 0;

  // The native FP8 GEMMs of a linear layer from C to OC features over `rows` tokens, with
  // `scaling`, input and weight in the `forward` format and the output gradient in `backward`;
  // null, with the reason in *why, on a backend that emulates FP8 or for a shape (or scaling)
  // its FP8 GEMMs cannot take. The output gradient's codes may be shared with other layers: cast
  // it right before backward(). `input_slot` >= 0 shares the input's codes with the other layers
  // of that slot too: only for layers whose input is cast again right before their backward pass,
  // with no layer of the slot in between (fp8_input_slot in src/model/transformer.h says which);
  // -1 keeps them the layer's own.
  // `weight_codes` says where the weight's codes live (Fp8Gemms::WeightCodes).
  virtual std::unique_ptr<Fp8Gemms> make_fp8_gemms(int64_t rows, int64_t C, int64_t OC, Fp8Gemms::Scaling scaling,
                                                   Format forward, Format backward, int input_slot,
                                                   Fp8Gemms::WeightCodes weight_codes, std::string* why) {
    (void)rows, (void)C, (void)OC, (void)scaling, (void)forward, (void)backward, (void)input_slot, (void)weight_codes;
    *why = "the " + name() + " backend emulates FP8 (dequantised values through its GEMMs)";
    return nullptr;
  }

  // Layers of rows x cols activations kept as FP8 codes in `format` (Fp8ActivationStore). This
  // default emulates the codes with their dequantised values in f32 (the CPU's store).
  virtual std::unique_ptr<Fp8ActivationStore> make_fp8_activation_store(int layers, int64_t rows, int64_t cols,
                                                                        Format format);

  // AdamW with decoupled weight decay on FP32 param/m/v, in place. If `param_copy` is not
  // empty it receives the updated parameters rounded to its format (the low-precision copy).
  virtual void adamw(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWParams& p,
                     Tensor param_copy) = 0;

  // The CUDA stream (cudaStream_t) all ops run on, for a communicator to order itself against;
  // null on the CPU.
  virtual void* stream() const { return nullptr; }

  // Device memory this backend holds (capacity), hands out now (in_use) and the most it has had
  // out at once (peak); zeros where the operating system accounts for memory, as on the CPU.
  struct MemoryUse {
    size_t capacity = 0, in_use = 0, peak = 0;
  };
  virtual MemoryUse memory_use() const { return {}; }

  // Returns the gradient-rounding counters since the last call and resets them.
  virtual GradNumerics take_grad_numerics() = 0;

  // Charges each op's wall time to `profile` (null: stop). False where ops run asynchronously,
  // as on a GPU, so that host time would say nothing (there: nsys, with ptrain's NVTX ranges).
  virtual bool set_profile(OpProfile* profile) {
    (void)profile;
    return false;
  }

  // Recording (CUDA graphs): the work of a sequence of ops captured once and replayed as one
  // launch, without the host's per-op calls. Why record() cannot succeed here; "" if it can.
  virtual std::string cannot_record() const {
    return "the " + name() + " backend runs each op as it is called and records none";
  }
  // Records the work `body` queues, without running it. Null, with the reason in *why, when
  // this backend cannot record or `body` did what a recording cannot hold (waited for the
  // device, read a result back): none of body's device work has then run, though its host-side
  // effects have. Errors that have nothing to do with recording propagate.
  virtual std::unique_ptr<RecordedWork> record(const std::function<void()>& body, std::string* why) {
    (void)body;
    *why = cannot_record();
    return nullptr;
  }
  // Changes whenever memory is allocated or released: a recording from another epoch may point
  // at memory that has been handed out again since.
  virtual uint64_t memory_epoch() const { return 0; }
};

// The CPU reference backend (OpenMP + OpenBLAS). `threads` = 0 uses every available core.
std::unique_ptr<Backend> make_cpu_backend(int threads);

}  // namespace ptrain
