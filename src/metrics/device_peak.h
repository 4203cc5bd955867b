// Dense peak FLOP/s of GPUs per GEMM precision, for MFU (README, "Model FLOP/s and MFU"), and the two peaks
// a run's MFU is quoted against. Each GPU is named by the CUDA device properties that identify
// it (compute capability, multiprocessors, memory, and the name only where two parts share
// those); its figures are NVIDIA's data sheets' dense (without sparsity) ones. A GPU this build
// does not target, or one not in the table, has no MFU rather than a guessed one.
#pragma once

#include <optional>
#include <string>

#include "backend/device.h"

namespace ptrain {

struct GemmPeaks {
  double fp32 = 0, tf32 = 0, bf16 = 0, fp8 = 0;  // FLOP/s, dense; fp16 runs at the bf16 rate
};

struct DevicePeaks {
  std::string part;    // "H100 SXM", "H200 NVL", ...
  GemmPeaks peaks;
  std::string source;  // the data sheet
};

// The table's row for `device`; without one, `why_none` says why (not an sm_90 part, or a
// Hopper part not in the table).
struct PeakLookup {
  std::optional<DevicePeaks> device;
  std::string why_none;
};
PeakLookup lookup_device_peaks(const CudaDeviceInfo& device);

// What MFU is measured against. `bf16`: the BF16 dense peak, the convention torchtitan and
// llm.c use whatever the precision. `mix`: the peak of the precision mix the run executes, each
// GEMM's FLOPs at its own precision's peak (FP8 GEMMs at the FP8 peak, the others at BF16, or
// TF32/FP32 in an fp32 run): total FLOPs / sum(FLOPs_i / peak_i). So an FP8 run's MFU against
// `mix` is neither inflated (against BF16) nor meaningless.
struct MfuPeaks {
  std::optional<double> bf16;
  double mix = 0;
};
// `fp8_share`: the fraction of the training FLOPs in FP8 GEMMs; `other`: the other GEMMs' peak.
double mixed_peak(double fp8_share, double fp8_peak, double other_peak);

}  // namespace ptrain
