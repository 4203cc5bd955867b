#include "metrics/device_peak.h"

namespace ptrain {

namespace {

constexpr double kTera = 1e12;
// NVIDIA's data sheets list tensor-core rates with 2:4 sparsity; dense is half of those.
// H100 SXM5 and H200 SXM share the compute; the NVL parts (PCIe cards) run at lower clocks.
constexpr GemmPeaks kHopperSxm{66.9 * kTera, 494.7 * kTera, 989.4 * kTera, 1978.9 * kTera};
constexpr GemmPeaks kH100Pcie{51.2 * kTera, 378.0 * kTera, 756.0 * kTera, 1513.0 * kTera};
constexpr GemmPeaks kHopperNvl{60.0 * kTera, 417.5 * kTera, 835.5 * kTera, 1670.5 * kTera};
const char* const kH100Sheet = "NVIDIA H100 Tensor Core GPU data sheet";
const char* const kH200Sheet = "NVIDIA H200 Tensor Core GPU data sheet";

}  // namespace

PeakLookup lookup_device_peaks(const CudaDeviceInfo& d) {
  const std::string cc = std::to_string(d.major) + "." + std::to_string(d.minor);
  if (d.major != 9 || d.minor != 0)
    return {std::nullopt, "this build targets sm_90a (Hopper); " + d.name + " is compute capability " + cc +
                              ", so no MFU is quoted"};
  const double gib = static_cast<double>(d.memory_bytes) / (1024.0 * 1024.0 * 1024.0);
  const bool nvl = d.name.find("NVL") != std::string::npos;
  // H100 parts carry 80 GB (SXM, PCIe) or 94 GB (NVL); H200 parts 141 GB. The GH200 superchip
  // (96 or 144 GB beside a Grace CPU) runs at other power limits and is left out.
  if (d.name.find("GH200") == std::string::npos) {
    if (d.multiprocessors == 114 && gib < 88) return {DevicePeaks{"H100 PCIe", kH100Pcie, kH100Sheet}, ""};
    if (d.multiprocessors == 132 && gib < 88 && !nvl) return {DevicePeaks{"H100 SXM", kHopperSxm, kH100Sheet}, ""};
    if (d.multiprocessors == 132 && gib >= 88 && gib < 110 && nvl)
      return {DevicePeaks{"H100 NVL", kHopperNvl, kH100Sheet}, ""};
    if (d.multiprocessors == 132 && gib >= 120 && gib < 150)
      return {nvl ? DevicePeaks{"H200 NVL", kHopperNvl, kH200Sheet} : DevicePeaks{"H200 SXM", kHopperSxm, kH200Sheet},
              ""};
  }
  return {std::nullopt, d.name + " (compute capability " + cc + ", " + std::to_string(d.multiprocessors) +
                            " multiprocessors, " + std::to_string(static_cast<int>(gib + 0.5)) +
                            " GiB) is not in ptrain's table of dense peaks (H100 SXM, PCIe and NVL; H200 SXM and "
                            "NVL), so no MFU is quoted"};
}

double mixed_peak(double fp8_share, double fp8_peak, double other_peak) {
  if (fp8_share <= 0) return other_peak;
  return 1.0 / (fp8_share / fp8_peak + (1.0 - fp8_share) / other_peak);
}

}  // namespace ptrain
