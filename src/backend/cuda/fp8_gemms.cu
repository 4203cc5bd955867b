// Native FP8 GEMMs of one linear layer (Backend::make_fp8_gemms): the layer's operands cast to
// E4M3/E5M2 codes in the arena, with transposes because cuBLASLt's FP8 GEMMs on Hopper take only
// the TN layout, and their dequantisation factors passed to cuBLASLt as scale pointers (per
// tensor) or block-scale arrays (1x128 and 128x128 blocks). A layer whose shape cuBLASLt's FP8
// GEMMs cannot take is refused before any memory is taken; one the library has no algorithm for,
// once its buffers are made and asked about (then given back). The model emulates either.
#include "backend/cuda/cuda_backend_impl.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <utility>

#include "backend/cuda/kernel_formats.h"
#include "core/error.h"
#include "elementwise.cuh"

namespace ptrain::cuda_impl {

// One linear layer's FP8 operands in the arena: the codes of input (rows,C), weight (OC,C) and
// grad (rows,OC), each with its transpose (cuBLASLt's FP8 GEMMs are TN only: dgrad reads W^T,
// wgrad reads input^T and grad^T; matmul.h), and their dequantisation factors in device
// memory for the scale pointers. Blocks that no layer needs after its own call are shared
// (CudaBackend::shared_fp8_operands_), every user writing them right before reading them on
// the one stream:
//  - the weight's codes and factors are the layer's own, cast once a step; its transpose is
//    made from the codes by each backward() (a byte transpose, so the GEMM reads the same
//    codes), into a block shared by the layers of its shape. So a model keeps one byte per
//    parameter of FP8 weights, as TransformerEngine's weight cache does on one layout. A
//    layer whose weight is cast right before each forward() and backward() (WeightCodes::
//    shared: ZeRO-3's, gathered into a room for each pass) shares codes and factors too; one
//    whose codes are handed to it (WeightCodes::handed: ZeRO-3's primary FP8 weights, gathered
//    as codes) keeps only its factors.
//  - the grad's are shared by every layer of the same shape: backward() reads what the cast
//    just before it wrote.
//  - the input's transpose and factors are the layer's own (kept from the forward pass for the
//    wgrad GEMM) and its codes, which only the forward GEMM reads, shared by the layers of its
//    shape; or, for the layers of one input slot, all of them are shared: the model casts
//    each such layer's input again right before its backward pass (fp8_input_slot in
//    src/model/transformer.h says which layers do).
// Per-tensor scaling: one cast pass per operand (input and grad cast with their transposes);
// one factor 1/scale each. Block scaling (Hopper, cuBLASLt >= 12.9): the weight in 128x128
// blocks (codes and transpose share the blocks; the cast writes the factors in both GEMMs'
// layouts); input and grad twice, 1x128 tiles for the forward and dgrad GEMMs and 128x1 tiles,
// written transposed, for wgrad. Every GEMM has one 1x128 operand, as cuBLASLt requires.
class CudaBackend::CudaFp8Gemms final : public Fp8Gemms {
 public:
  CudaFp8Gemms(CudaBackend& be, int64_t rows, int64_t C, int64_t OC, Scaling scaling, int input_slot,
               WeightCodes weight_codes)
      : be_(be), rows_(rows), C_(C), OC_(OC), scaling_(scaling), input_slot_(input_slot),
        shared_weight_(weight_codes == WeightCodes::shared), handed_weight_(weight_codes == WeightCodes::handed) {
    const std::array<int64_t, 3> sizes = {rows * C, OC * C, rows * OC};
    try {
      for (int i = 0; i < 3; ++i) acquire_operand(static_cast<Operand>(i), static_cast<size_t>(sizes[i]));
      stats_ = static_cast<DeviceScalars*>(be_.allocate(sizeof(DeviceScalars) * (kDiscard + 1)));
      current_amax_ = static_cast<float*>(be_.allocate(sizeof(float)));
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaFp8Gemms() override { release(); }
  CudaFp8Gemms(const CudaFp8Gemms&) = delete;
  CudaFp8Gemms& operator=(const CudaFp8Gemms&) = delete;

  // The three GEMMs' specs, for one combination of formats and output dtypes.
  static GemmSpec forward_spec(int64_t rows, int64_t C, int64_t OC, Format in, Format w, DType out, Scaling sc) {
    GemmSpec spec = linear_forward_gemm(rows, C, OC, cuda_data_type(in), cuda_data_type(w), cuda_type(out));
    scale_modes(spec, sc, GemmScale::block_128x128, GemmScale::block_1x128);
    spec.fast_accum = sc == Scaling::tensor;  // forward only, and never with block scaling, as TransformerEngine's recipes do
    return spec;
  }
  static GemmSpec dgrad_spec(int64_t rows, int64_t C, int64_t OC, Format grad, Format w, DType out, Scaling sc) {
    GemmSpec spec = linear_dgrad_gemm(rows, C, OC, cuda_data_type(grad), cuda_data_type(w), cuda_type(out), true);
    scale_modes(spec, sc, GemmScale::block_128x128, GemmScale::block_1x128);
    return spec;
  }
  static GemmSpec wgrad_spec(int64_t rows, int64_t C, int64_t OC, Format grad, Format in, DType out, Scaling sc) {
    GemmSpec spec = linear_wgrad_gemm(rows, C, OC, cuda_data_type(grad), cuda_data_type(in), cuda_type(out), true);
    scale_modes(spec, sc, GemmScale::block_1x128, GemmScale::block_1x128);
    return spec;
  }

  // Whether cuBLASLt on this GPU runs the three GEMMs with these formats (bf16 outputs and the
  // FP32 weight gradient, as the model's FP8 layers write) on this layer's buffers; if not, *why
  // says which it refused. Each is asked of the heuristic and then launched once, into a scratch
  // output (the operands hold whatever the arena or a layer sharing them left there; the result
  // is thrown away): cuBLASLt can refuse at launch what its heuristic offered, and a refusal
  // inside a step would end the run, where one here leaves the layer to the emulation.
  bool runs_here(Format forward, Format backward, std::string* why) {
    why->clear();
    const size_t outputs = static_cast<size_t>(std::max({rows_ * OC_, rows_ * C_, OC_ * C_}));
    struct Scratch {  // given back however the probe ends
      CudaBackend& be;
      void* p;
      ~Scratch() { be.release(p); }
    } scratch{be_, be_.allocate(outputs * dtype_size(DType::f32))};
    // Handed weight codes: the probe reads codes of its own, given back with it.
    struct HandedProbe {
      CudaBackend& be;
      fp8*& codes;
      void* p;
      ~HandedProbe() {
        if (p) {
          codes = nullptr;
          be.release(p);
        }
      }
    } handed{be_, codes_[kWeight], handed_weight_ ? be_.allocate(static_cast<size_t>(OC_ * C_)) : nullptr};
    if (handed.p) codes_[kWeight] = static_cast<fp8*>(handed.p);
    const std::pair<const char*, std::pair<GemmSpec, GemmArgs>> gemms[] = {
        {"forward", {forward_spec(rows_, C_, OC_, forward, forward, DType::bf16, scaling_), forward_args(scratch.p)}},
        {"dgrad", {dgrad_spec(rows_, C_, OC_, backward, forward, DType::bf16, scaling_), dgrad_args(scratch.p)}},
        {"wgrad", {wgrad_spec(rows_, C_, OC_, backward, forward, DType::f32, scaling_), wgrad_args(scratch.p)}}};
    for (const auto& [name, gemm] : gemms)
      if (const std::string problem = be_.matmul_->probe(gemm.first, gemm.second, be_.stream_); !problem.empty()) {
        *why = std::string("cuBLASLt on this GPU cannot run the ") + name + " GEMM: " + problem;
        return false;
      }
    return true;
  }

  void cast(Operand which, Tensor in, Format format, float scale, bool record) override {
    const char* op = "fp8 cast";
    PTRAIN_CHECK(scaling_ == Scaling::tensor, "fp8 cast: these GEMMs take block-scaled operands (cast_blocks)");
    const std::pair<int, int> shape = expect_operand(op, which, in, format);
    formats_[which] = format;
    DeviceScalars* slot = stats_slot(which, record);
    kernels::set_scale(&slot->scale, factors_[which], scale, be_.stream_);  // the factor: 1/scale, as the CPU's
    cast_codes(op, which, in, format, shape, slot);
  }

  void cast_current(Operand which, Tensor in, Format format, bool record) override {
    const char* op = "fp8 cast (current scaling)";
    PTRAIN_CHECK(scaling_ == Scaling::tensor, "fp8 cast: these GEMMs take block-scaled operands (cast_blocks)");
    const std::pair<int, int> shape = expect_operand(op, which, in, format);
    formats_[which] = format;
    DeviceScalars* slot = stats_slot(which, record);
    PTRAIN_CUDA_CHECK(cudaMemsetAsync(current_amax_, 0, sizeof(float), be_.stream_));
    with_float_type(in.dtype, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::amax<T>(current_amax_, in.as<T>(), static_cast<size_t>(in.numel()), be_.stream_);
    });
    kernels::current_scale_from_amax(&slot->scale, factors_[which], current_amax_, format_max(format), be_.stream_);
    cast_codes(op, which, in, format, shape, slot);
  }

  void cast_blocks(Operand which, Tensor in, Format format, int block_rows, int block_cols, bool record) override {
    const char* op = "fp8 block cast";
    PTRAIN_CHECK(scaling_ == Scaling::blocks, "fp8 block cast: these GEMMs take per-tensor scales (cast)");
    const std::pair<int, int> shape = expect_operand(op, which, in, format);
    const int r = shape.first, c = shape.second;  // named, not bound: lambdas capture them (C++17)
    constexpr int kB = 128;
    kernels::Fp8BlockCodes dst;
    if (which == kWeight && block_rows == kB && block_cols == kB) {  // the transpose's codes: backward()
      dst.codes = codes_[which];
      dst.scale_inv = factors(which, false);
      dst.layout = factor_layout(which, false);
      dst.scale_inv_t = factors(which, true);
      dst.layout_t = factor_layout(which, true);
    } else if (which != kWeight && block_rows == 1 && block_cols == kB) {
      dst.codes = codes_[which];
      dst.scale_inv = factors(which, false);
      dst.layout = factor_layout(which, false);
    } else if (which != kWeight && block_rows == kB && block_cols == 1) {
      dst.codes_t = transposed_[which];
      dst.scale_inv_t = factors(which, true);
      dst.layout_t = factor_layout(which, true);
    } else {
      PTRAIN_CHECK(false, "fp8 block cast: " + std::to_string(block_rows) + "x" + std::to_string(block_cols) +
                              " blocks are not this operand's tiling");
    }
    formats_[which] = format;
    DeviceScalars* slot = stats_slot(which, record);
    with_float_type(in.dtype, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::fp8_quantize_blocks_into<T>(dst, &slot->amax, &slot->counts, in.as<T>(), r, c, block_rows, block_cols,
                                           fp8_interpretation(format), be_.stream_);
    });
  }

  void queue_stats_read() override {
    if (read_queued_) return;
    constexpr size_t kBytes = 3 * sizeof(DeviceScalars);
    void* host = stats_read_.acquire(kBytes);
    PTRAIN_CUDA_CHECK(cudaMemcpyAsync(host, stats_, kBytes, cudaMemcpyDeviceToHost, be_.stream_));
    PTRAIN_CUDA_CHECK(cudaMemsetAsync(stats_, 0, kBytes, be_.stream_));
    stats_read_.queued(be_.stream_);
    read_queued_ = true;
  }

  std::array<OperandStats, 3> take_stats() override {
    queue_stats_read();
    const auto* host = static_cast<const DeviceScalars*>(stats_read_.acquire(3 * sizeof(DeviceScalars)));
    read_queued_ = false;
    std::array<OperandStats, 3> out;
    for (int i = 0; i < 3; ++i) {
      out[i].stats = to_stats(host[i]);
      out[i].scale = scaling_ == Scaling::tensor ? host[i].scale : NAN;
    }
    return out;
  }

  Tensor weight_codes() override {
    PTRAIN_CHECK(!handed_weight_, "fp8 weight codes: this layer's codes are handed to it (bind_weight_codes)");
    return Tensor(codes_[kWeight], DType::u8, {OC_, C_}, Device::cuda);
  }

  void bind_weight_codes(Tensor codes) override {
    const char* op = "fp8 weight codes";
    PTRAIN_CHECK(handed_weight_, "fp8 weight codes: this layer keeps its own (bind_weight_codes is for handed ones)");
    PTRAIN_EXPECT(codes.dtype == DType::u8 && codes.numel() == OC_ * C_ && codes.device == Device::cuda, op,
                  "expected " + std::to_string(OC_) + " x " + std::to_string(C_) + " u8 codes on the device, got " +
                      codes.shape_string());
    codes_[kWeight] = static_cast<fp8*>(codes.data);
  }

  // The factors of codes written into weight_codes(): 1 / scale, per tensor through the discard
  // slot (nothing recorded), per 128x128 block in both GEMMs' layouts as cast_blocks writes them.
  void set_weight_scales(Format format, const std::vector<float>& scales) override {
    const char* op = "fp8 weight scales";
    PTRAIN_EXPECT(is_fp8(format), op, std::string("the format must be e4m3 or e5m2, got ") + format_name(format));
    formats_[kWeight] = format;
    if (scaling_ == Scaling::tensor) {
      PTRAIN_EXPECT(scales.size() == 1, op, "one scale per tensor expected");
      kernels::set_scale(&stats_slot(kWeight, false)->scale, factors_[kWeight], scales[0], be_.stream_);
      return;
    }
    constexpr int64_t kB = 128;
    const int64_t tile_rows = (OC_ + kB - 1) / kB, tile_cols = (C_ + kB - 1) / kB;
    PTRAIN_EXPECT(static_cast<int64_t>(scales.size()) == tile_rows * tile_cols, op,
                  "one scale per 128x128 block expected");
    for (const bool transposed : {false, true}) {
      const kernels::BlockScaleLayout layout = factor_layout(kWeight, transposed);
      std::vector<float> factors(static_cast<size_t>(factor_count(kWeight, transposed)), 0.0f);
      for (int64_t i = 0; i < tile_rows; ++i)
        for (int64_t j = 0; j < tile_cols; ++j)
          factors.at(static_cast<size_t>(i * layout.row_stride + j * layout.col_stride)) =
              1.0f / scales[static_cast<size_t>(i * tile_cols + j)];
      // From pageable memory: staged before cudaMemcpyAsync returns, so `factors` may go.
      PTRAIN_CUDA_CHECK(cudaMemcpyAsync(this->factors(kWeight, transposed), factors.data(),
                                        factors.size() * sizeof(float), cudaMemcpyHostToDevice, be_.stream_));
    }
  }

  void forward(Tensor out, Tensor bias) override {
    const char* op = "fp8 forward GEMM";
    expect_float(op, "out", out);
    expect_float(op, "bias", bias);
    PTRAIN_EXPECT(out.numel() == rows_ * OC_ && (bias.empty() || bias.numel() == OC_), op,
                  "shape mismatch: out " + out.shape_string() + " bias " + bias.shape_string());
    Staged st(be_);
    const Tensor o = st.out(out, out.dtype, false);
    GemmSpec spec = forward_spec(rows_, C_, OC_, formats_[kInput], formats_[kWeight], out.dtype, scaling_);
    GemmArgs args = forward_args(o.data);
    // cuBLASLt's FP8 GEMMs take a bf16/fp16 bias with an output of that type, never an f32 bias.
    bool fused_bias = !bias.empty() && bias.dtype == out.dtype && out.dtype != DType::f32 &&
                      reinterpret_cast<uintptr_t>(bias.data) % 16 == 0;
    if (fused_bias) {
      GemmSpec with_bias = spec;
      with_bias.epilogue = CUBLASLT_EPILOGUE_BIAS;
      with_bias.bias_type = cuda_type(bias.dtype);
      GemmArgs bias_args = args;
      bias_args.bias = bias.data;
      fused_bias = be_.matmul_->try_run(with_bias, bias_args, be_.stream_);
    }
    if (!fused_bias) be_.matmul_->run(spec, args, be_.stream_);
    if (!bias.empty() && !fused_bias) {
      const Tensor bb = st.in(bias, out.dtype);
      with_float_type(out.dtype, op, [&](auto tag) {
        PTRAIN_ELEMENT_TYPE(T, tag);
        kernels::bias_add<T>(o.as<T>(), bb.as<T>(), to_int(rows_, op, "rows"), to_int(OC_, op, "columns"), be_.stream_);
      });
    }
    st.finish();
  }

  void backward(Tensor dinp, Tensor dweight) override {
    const char* op = "fp8 backward GEMMs";
    expect_float(op, "dinp", dinp);
    expect_float(op, "dweight", dweight);
    PTRAIN_EXPECT((dinp.empty() || dinp.numel() == rows_ * C_) && (dweight.empty() || dweight.numel() == OC_ * C_), op,
                  "shape mismatch: dinp " + dinp.shape_string() + " dweight " + dweight.shape_string());
    Staged st(be_);
    if (!dinp.empty()) {  // dinp(rows,C) += grad(rows,OC) W(OC,C)
      const Tensor o = st.out(dinp, dinp.dtype, true);
      kernels::fp8_transpose(transposed_[kWeight], codes_[kWeight], to_int(OC_, op, "rows"), to_int(C_, op, "columns"),
                             be_.stream_);
      be_.matmul_->run(dgrad_spec(rows_, C_, OC_, formats_[kGrad], formats_[kWeight], dinp.dtype, scaling_),
                       dgrad_args(o.data), be_.stream_);
    }
    if (!dweight.empty()) {  // dW(OC,C) += grad^T input
      const Tensor o = st.out(dweight, dweight.dtype, true);
      be_.matmul_->run(wgrad_spec(rows_, C_, OC_, formats_[kGrad], formats_[kInput], dweight.dtype, scaling_),
                       wgrad_args(o.data), be_.stream_);
    }
    st.finish();
  }

 private:
  static void scale_modes(GemmSpec& spec, Scaling sc, GemmScale a_blocks, GemmScale b_blocks) {
    spec.a_scale = sc == Scaling::tensor ? GemmScale::tensor : a_blocks;
    spec.b_scale = sc == Scaling::tensor ? GemmScale::tensor : b_blocks;
  }
  // A GEMM reading operand a's codes (or their transpose) as A and b's as B, with their factors.
  GemmArgs operand_args(Operand a, bool a_transposed, Operand b, bool b_transposed, void* d, float beta) const {
    GemmArgs args;
    args.a = a_transposed ? transposed_[a] : codes_[a];
    args.b = b_transposed ? transposed_[b] : codes_[b];
    args.d = d;
    args.beta = beta;
    args.a_scale_inv = factors(a, a_transposed);
    args.b_scale_inv = factors(b, b_transposed);
    return args;
  }
  // out(rows,OC) = input W^T: A = W codes, B = input codes.
  GemmArgs forward_args(void* d) const { return operand_args(kWeight, false, kInput, false, d, 0.0f); }
  // dinp += grad W: A = W^T codes, B = grad codes.
  GemmArgs dgrad_args(void* d) const { return operand_args(kWeight, true, kGrad, false, d, 1.0f); }
  // dW += grad^T input: A = input^T codes, B = grad^T codes.
  GemmArgs wgrad_args(void* d) const { return operand_args(kInput, true, kGrad, true, d, 1.0f); }

  // Where an operand's casts gather their statistics; an evaluation's go to a slot never read.
  static constexpr int kDiscard = 3;
  // (A device address: never dereferenced here, only offset to its fields.)
  DeviceScalars* stats_slot(Operand which, bool record) const { return stats_ + (record ? which : kDiscard); }

  // The per-tensor cast with the scale in slot.scale: codes, and for input and grad their
  // transpose in the same pass (the weight's is made by backward()).
  void cast_codes(const char* op, Operand which, const Tensor& in, Format format, std::pair<int, int> shape,
                  DeviceScalars* slot) {
    const int r = shape.first, c = shape.second;
    fp8* transpose = which == kWeight ? nullptr : transposed_[which];
    with_float_type(in.dtype, op, [&](auto tag) {
      PTRAIN_ELEMENT_TYPE(T, tag);
      kernels::fp8_cast<T>(codes_[which], transpose, &slot->amax, &slot->counts, in.as<T>(), r, c, &slot->scale,
                           fp8_interpretation(format), be_.stream_);
    });
  }

  std::pair<int, int> expect_operand(const char* op, Operand which, const Tensor& in, Format format) const {
    expect_float(op, "in", in);
    PTRAIN_EXPECT(is_fp8(format), op, std::string("the format must be e4m3 or e5m2, got ") + format_name(format));
    const auto [rows, cols] = shape_of(which);
    PTRAIN_EXPECT(
        in.numel() == rows * cols, op,
        "expected " + std::to_string(rows) + " x " + std::to_string(cols) + " elements, got " + in.shape_string());
    return {to_int(rows, op, "rows"), to_int(cols, op, "columns")};
  }
  std::pair<int64_t, int64_t> shape_of(Operand which) const {
    return which == kInput ? std::pair{rows_, C_} : which == kWeight ? std::pair{OC_, C_} : std::pair{rows_, OC_};
  }

  // The dequantisation factors of an operand's codes (transposed: of its transpose). As GEMM
  // operands (matmul.h, gemm_scale_floats): the weight is BLK128x128, the codes (outer OC, K
  // = C) and the transpose (outer C, K = OC); input and grad are VEC128, the codes (outer
  // rows, K = columns) and the transposes (outer columns, K = rows).
  float* factors(Operand which, bool transposed) const {
    return transposed && scaling_ == Scaling::blocks ? factors_t_[which] : factors_[which];
  }
  int64_t factor_count(Operand which, bool transposed) const {
    if (scaling_ == Scaling::tensor) return 1;
    const auto [rows, cols] = shape_of(which);
    const GemmScale mode = which == kWeight ? GemmScale::block_128x128 : GemmScale::block_1x128;
    return transposed ? gemm_scale_floats(mode, rows, cols) : gemm_scale_floats(mode, cols, rows);
  }
  // Where block (i, j) of the (rows, cols) operand puts its factor. VEC128 factors run along
  // the outer dimension (index outer + k_block * outer_length); BLK128x128 factors run along K
  // (index k_block + outer_block * ceil(K/128) rounded up to 4).
  kernels::BlockScaleLayout factor_layout(Operand which, bool transposed) const {
    const auto [rows, cols] = shape_of(which);
    const auto k_blocks_padded = [](int64_t k) { return static_cast<int>((k + 128 * 4 - 1) / (128 * 4) * 4); };
    if (which == kWeight)
      return transposed ? kernels::BlockScaleLayout{1, k_blocks_padded(rows)}
                        : kernels::BlockScaleLayout{k_blocks_padded(cols), 1};
    return transposed ? kernels::BlockScaleLayout{static_cast<int>(cols), 1}
                      : kernels::BlockScaleLayout{1, static_cast<int>(rows)};
  }

  // What of an operand's blocks its layer shares, and with whom (shared_key): the grad's all
  // of them, with every layer of its shape; an input in a slot all of them, with the layers of
  // the slot; any other input its codes (only the forward GEMM reads them, right after the
  // cast; wgrad reads the transpose, kept), with the layers of its shape; the weight its
  // transpose, made by backward(), with the layers of its shape, or all of it, with the layers
  // of its shape that share their weights too.
  struct SharedParts {
    bool codes, transposed, factors;
  };
  SharedParts shared_parts(Operand which) const {
    if (which == kWeight) return {shared_weight_, true, shared_weight_};
    if (which == kInput && input_slot_ < 0) return {true, false, false};
    return {true, true, true};
  }
  std::array<int64_t, 5> shared_key(Operand which) const {
    const auto [rows, cols] = shape_of(which);
    const int64_t slot = which == kInput ? input_slot_ : which == kWeight && shared_weight_ ? 0 : -1;
    return {which, slot, rows, cols, static_cast<int64_t>(scaling_)};
  }

  // Operand `which`'s blocks: the shared ones made by their first user (or taken from it), the
  // rest the layer's own.
  void acquire_operand(Operand which, size_t bytes) {
    const SharedParts parts = shared_parts(which);
    CudaBackend::SharedFp8Operand& shared = be_.shared_fp8_operands_[shared_key(which)];
    const bool first = shared.users == 0;
    const bool handed = which == kWeight && handed_weight_;  // bind_weight_codes points at them
    if ((first || !parts.codes) && !handed) codes_[which] = static_cast<fp8*>(be_.allocate(bytes));
    if (first || !parts.transposed) transposed_[which] = static_cast<fp8*>(be_.allocate(bytes));
    if (first || !parts.factors) {
      factors_[which] =
          static_cast<float*>(be_.allocate(sizeof(float) * static_cast<size_t>(factor_count(which, false))));
      if (scaling_ == Scaling::blocks)  // per tensor, codes and transpose share their one factor
        factors_t_[which] =
            static_cast<float*>(be_.allocate(sizeof(float) * static_cast<size_t>(factor_count(which, true))));
    }
    if (first) {
      if (parts.codes) shared.codes = codes_[which];
      if (parts.transposed) shared.transposed = transposed_[which];
      if (parts.factors) {
        shared.factors = factors_[which];
        shared.factors_t = factors_t_[which];
      }
    } else {
      if (parts.codes) codes_[which] = static_cast<fp8*>(shared.codes);
      if (parts.transposed) transposed_[which] = static_cast<fp8*>(shared.transposed);
      if (parts.factors) {
        factors_[which] = static_cast<float*>(shared.factors);
        factors_t_[which] = static_cast<float*>(shared.factors_t);
      }
    }
    ++shared.users;
    holds_shared_[which] = true;
  }

  // Leaves a shared set to its other users, or (the last user, or a first one that failed while
  // making it) lets release() free it with the layer's own blocks.
  void release_shared(Operand which) noexcept {
    const auto it = be_.shared_fp8_operands_.find(shared_key(which));
    if (it == be_.shared_fp8_operands_.end()) return;
    if (holds_shared_[which] && --it->second.users > 0) {
      const SharedParts parts = shared_parts(which);
      if (parts.codes) codes_[which] = nullptr;
      if (parts.transposed) transposed_[which] = nullptr;
      if (parts.factors) factors_[which] = factors_t_[which] = nullptr;
    } else if (it->second.users == 0) {
      be_.shared_fp8_operands_.erase(it);
    }
    holds_shared_[which] = false;
  }

  void release() noexcept {
    for (const Operand which : {kInput, kWeight, kGrad}) release_shared(which);
    if (handed_weight_) codes_[kWeight] = nullptr;  // a room's, not this layer's
    for (fp8*& p : codes_) free_quietly(p);
    for (fp8*& p : transposed_) free_quietly(p);
    for (float*& p : factors_) free_quietly(p);
    for (float*& p : factors_t_) free_quietly(p);
    free_quietly(stats_);
    free_quietly(current_amax_);
  }
  template <typename P>
  void free_quietly(P*& p) noexcept {
    if (!p) return;
    try {
      be_.release(p);
    } catch (...) {  // a destructor must not throw; the arena goes with the backend anyway
    }
    p = nullptr;
  }

  CudaBackend& be_;
  int64_t rows_, C_, OC_;
  Scaling scaling_;
  std::array<fp8*, 3> codes_{}, transposed_{};
  std::array<float*, 3> factors_{}, factors_t_{};
  std::array<Format, 3> formats_{Format::e4m3, Format::e4m3, Format::e5m2};
  DeviceScalars* stats_ = nullptr;  // per operand, then the discard slot
  PinnedStaging stats_read_;        // where take_stats() reads the operands' slots to
  bool read_queued_ = false;        // a read into stats_read_ is queued and not taken yet
  float* current_amax_ = nullptr;   // current scaling: the tensor's amax, read by the scale kernel
  int input_slot_;                         // -1: the input's codes are the layer's own
  bool shared_weight_;                     // the weight's codes and factors shared too
  bool handed_weight_;                     // the weight's codes bound before each pass, not allocated
  std::array<bool, 3> holds_shared_{};     // counted among the users of the operand's shared set
};

// The model's FP8 operands are bf16 (or f32) in device memory, its outputs bf16, fp16 or f32 and
// its weight gradients the FP32 main gradients: cuBLASLt takes all of them. What can refuse is the shape (FP8 leading dimensions must
// be multiples of 16 bytes; block scaling wants multiples of 128) and, for block scaling, the
// GPU and cuBLASLt version (Hopper, cuBLASLt >= 12.9): each GEMM the layer will run is
// validated here, then asked of cuBLASLt on the layer's own buffers, once.
std::unique_ptr<Fp8Gemms> CudaBackend::make_fp8_gemms(int64_t rows, int64_t C, int64_t OC, Fp8Gemms::Scaling scaling,
                                                      Format forward, Format backward, int input_slot,
                                                      Fp8Gemms::WeightCodes weight_codes, std::string* why) {
  // The recipes' shape rule first (the one the config and the memory plan apply), then cuBLASLt's
  // own rules for each GEMM as ptrain knows them.
  const Fp8Recipe rule = scaling == Fp8Gemms::Scaling::blocks ? Fp8Recipe::block : Fp8Recipe::current;
  if (const std::string problem = fp8_layer_problem(rows, C, OC, rule); !problem.empty()) {
    *why = "this layer's shape does not suit cuBLASLt's FP8 GEMMs: " + problem;
    return nullptr;
  }
  for (const GemmSpec& spec : {CudaFp8Gemms::forward_spec(rows, C, OC, forward, forward, DType::bf16, scaling),
                               CudaFp8Gemms::dgrad_spec(rows, C, OC, backward, forward, DType::bf16, scaling),
                               CudaFp8Gemms::wgrad_spec(rows, C, OC, backward, forward, DType::f32, scaling)})
    if (const std::string problem = gemm_spec_problem(spec); !problem.empty()) {
      *why = "this layer's shape does not suit cuBLASLt's FP8 GEMMs: " + problem;
      return nullptr;
    }
  auto gemms = std::make_unique<CudaFp8Gemms>(*this, rows, C, OC, scaling, input_slot, weight_codes);
  if (!gemms->runs_here(forward, backward, why)) return nullptr;
  return gemms;
}

}  // namespace ptrain::cuda_impl
