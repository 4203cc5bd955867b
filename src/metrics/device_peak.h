// Dense peak FLOP/s of GPUs, per precision, for MFU (DESIGN.md section 7). Taken from NVIDIA's
// data sheets (dense, without sparsity); a device not in the table has no MFU rather than a
// guessed one.
#pragma once

#include <optional>
#include <string>

namespace ptrain {

// `mode` is precision.mode (fp32 | bf16 | fp16 | fp8); fp32 counts TF32 tensor cores when tf32.
std::optional<double> dense_peak_flops(const std::string& device_name, const std::string& mode, bool tf32);

}  // namespace ptrain
