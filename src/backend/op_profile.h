// Where a CPU training step's time goes (`ptrain bench --profile`): the backend charges the wall
// time of each op to its family, exclusive of the families it calls (a layer's rounding pass is
// "rounding", not "layernorm"), and counts the GEMMs' FLOPs so their own rate can stand beside the
// sgemm ceiling. The trainer closes each optimizer step; the report gives medians over steps.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace ptrain {

enum class OpFamily {
  gemm,         // the linear layers' GEMMs, the LM head's included
  attention,    // scores, causal softmax and the weighted values, with their GEMMs
  classifier,   // softmax, loss and logit gradients over the vocabulary
  norms,        // LayerNorm, RMSNorm
  activations,  // GELU, SwiGLU
  bias,         // bias adds and bias gradients
  residual,     // elementwise adds
  embedding,
  adamw,
  rounding,     // reduced-precision rounding of op outputs and copies
  fp8_casts,    // FP8 casts and amax
  reductions,   // gradient norm and loss sums
  memory,       // zeroing, uploads, downloads, copies
  count
};

const char* op_family_name(OpFamily f);

class OpProfile {
 public:
  using Clock = std::chrono::steady_clock;
  using Now = Clock::time_point (*)();

  // `now` reads the clock (tests pass a fake one).
  explicit OpProfile(Now now = &Clock::now) : now_(now) {}

  // Starts charging time to `f` (the family that was running pauses); end() resumes it.
  void begin(OpFamily f);
  void end();
  // One GEMM of `shape` (e.g. "1024x50304x256 NT": M x N x K, op(A) op(B)) took `seconds`.
  void add_gemm(const std::string& shape, double flops, double seconds);
  Clock::time_point now() const { return now_(); }
  // Only ops between begin_step and end_step are counted (an evaluation between steps is not).
  void begin_step();
  // Closes one optimizer step of `step_s` seconds.
  void end_step(double step_s);

  struct Row {
    OpFamily family;
    double ms = 0;  // median over the timed steps
    double share = 0;  // ms / median step
  };
  struct GemmShape {
    std::string shape;
    double ms = 0;  // mean per timed step
    double flops_per_s = 0;
  };
  struct Summary {
    size_t steps = 0;   // timed steps (the first, warm-up, is left out)
    double step_ms = 0;  // median step
    std::vector<Row> rows;  // families with any time, largest first
    double outside_ms = 0;  // median of (step - all ops): the trainer, data, communication
    double gemm_flops_per_s = 0;  // the GEMMs' FLOPs over their time, summed over the timed steps
    std::vector<GemmShape> gemm_shapes;  // largest time first
  };
  Summary summary() const;

 private:
  Now now_;
  bool in_step_ = false;
  std::vector<OpFamily> stack_;
  Clock::time_point last_{};
  std::array<double, static_cast<size_t>(OpFamily::count)> current_{};
  double current_gemm_flops_ = 0;
  std::vector<std::array<double, static_cast<size_t>(OpFamily::count)>> steps_;
  std::vector<double> step_seconds_, gemm_flops_;
  std::map<std::string, std::pair<double, double>> shapes_;  // seconds, FLOPs over the timed steps

  void charge(Clock::time_point now);
};

// Times one op: charges its time to `family` when profiling, costs nothing otherwise.
class OpScope {
 public:
  OpScope(OpProfile* profile, OpFamily family) : profile_(profile) {
    if (profile_) profile_->begin(family);
  }
  ~OpScope() {
    if (profile_) profile_->end();
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  OpProfile* profile_;
};

// The summary as the table `ptrain bench --profile` prints; `ceiling_flops` (the sgemm rate
// measured in the same run) puts the GEMMs' rate beside it.
std::string format_profile(const OpProfile::Summary& s, double ceiling_flops);

}  // namespace ptrain
