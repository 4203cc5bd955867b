// One table of op cases, in the manner of ggml's test-backend-ops: each case names an op of the
// Backend interface, its operands (shape, format, how they are filled, which ones it writes and
// how each result is checked) and how to call it. A runner runs a case on a reference backend
// and on the backend under test from identical inputs and compares what it wrote:
//   - the CPU backend at 1 thread against itself at 3 (tests/test_op_table.cpp): bit for bit,
//     the promise that a run's numbers do not depend on training.threads;
//   - the CUDA backend on the simulated device, whose kernels run under the SIMT emulator
//     (tests/gpu/test_cuda_backend.cpp, built against tests/sim): within the format's tolerance;
//   - the same file built for a real GPU.
// The kernel tests (tests/kernels) stay for what only a kernel launch shows: every thread order,
// unaligned views, each kernel variant.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "tolerances.h"

namespace ptrain::test {

// How an operand starts: values on its format's grid, uniform in [-scale, scale]; zeros; token
// ids below `vocab`; the RoPE table of its shape (T, hs/2, 2).
enum class Fill { uniform, zeros, tokens, rope };
// How a result is compared: not at all (an input, or scratch), within the format's op or GEMM
// tolerance, within 1e-5 (FP32 statistics: means, reciprocal deviations, losses), or bit for bit.
enum class Check { none, op, gemm, statistic, exact };

struct OpOperand {
  std::string name;
  std::vector<int64_t> shape;
  Format format = Format::fp32;  // the grid of its values; its storage is the backend's for this format
  bool written = false;          // the op writes it rather than reading or adding into it: NaN before the op
  Check check = Check::none;
  Fill fill = Fill::uniform;
  float scale = 1.0f;
  uint64_t seed = 0;
  int vocab = 0;  // Fill::tokens
};

struct OpCase {
  std::string family;  // the ops a test case of a runner takes together ("layernorm", "matmul", ...)
  std::string label;   // the op and its shape, for messages
  std::vector<OpOperand> operands;
  // Run on the reference backend before anything else: what a backward op needs from its forward
  // (saved statistics, probabilities), left in the operands that both backends then start from.
  std::function<void(Backend&, std::vector<Tensor>&)> prepare;
  std::function<void(Backend&, std::vector<Tensor>&)> run;  // the op under test, on either backend
};

// Every case of the table, or those of one family (a family with no case is a logic error).
const std::vector<OpCase>& op_cases();
std::vector<OpCase> op_cases(const std::string& family);
// The families, in the order of their first case.
std::vector<std::string> op_families();

// What a case's checked operands came to on each backend.
struct OperandResult {
  const OpOperand* operand;
  std::vector<float> reference, tested;
};
std::vector<OperandResult> run_op_case(const OpCase& c, Backend& reference, Backend& tested);

// The bound a checked operand is held to against a reference on another backend (Check::exact:
// none, compared bit for bit). cuBLASLt and OpenBLAS sum a dot product in different orders.
Tolerance check_tolerance(const OpOperand& operand);

// Positions where two results differ in their bits (NaN equal only to the same NaN bits).
size_t bit_differences(const std::vector<float>& a, const std::vector<float>& b, size_t* first);

}  // namespace ptrain::test
