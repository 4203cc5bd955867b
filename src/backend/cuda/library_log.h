// What NVIDIA's libraries accepted on this machine, for checking a simulation or another GPU
// against: with PTRAIN_LIBRARY_LOG=FILE set, every cuBLASLt heuristic query (the GEMM, the
// alignment asked for, the status and the algorithm chosen) and every cuDNN attention plan (the
// engines chosen, or why none was) is appended to FILE as one JSON object per line.
// scripts/gpu-check.sh sets it for each stage and brings the file back. Unset: nothing is
// written and the cost is one branch per new plan.
#pragma once

#include <nlohmann/json.hpp>

namespace ptrain {

bool library_log_enabled();
// Appends `record` as one line and flushes; a failed write is reported once on stderr and
// never stops a run.
void log_library_choice(const nlohmann::json& record);

}  // namespace ptrain
