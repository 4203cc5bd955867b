#include "metrics/device_peak.h"

namespace ptrain {

namespace {
struct Peaks {
  double fp32, tf32, half, fp8;  // TFLOP/s, dense
};
// H100 SXM5 and H200 share the compute (989 TFLOP/s dense BF16, 1979 FP8); H100 PCIe runs lower.
constexpr Peaks kHopperSxm{66.9, 494.7, 989.4, 1978.9};
constexpr Peaks kHopperPcie{51.2, 378.0, 756.0, 1513.0};
}  // namespace

std::optional<double> dense_peak_flops(const std::string& device_name, const std::string& mode, bool tf32) {
  const auto has = [&](const char* s) { return device_name.find(s) != std::string::npos; };
  const Peaks* p = nullptr;
  if (has("H100") && has("PCIe"))
    p = &kHopperPcie;
  else if (has("H100") || has("H200"))
    p = &kHopperSxm;
  if (!p) return std::nullopt;
  const double tflops = mode == "fp8" ? p->fp8 : (mode == "bf16" || mode == "fp16") ? p->half : tf32 ? p->tf32 : p->fp32;
  return tflops * 1e12;
}

}  // namespace ptrain
