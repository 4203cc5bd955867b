// The op table (op_table.h) on the CPU backend: each case at 1 thread and at 3 gives the same
// bits, and writes every element it should (the runner fills written operands with NaN first).
#include <catch2/catch.hpp>

#include <cmath>
#include <set>

#include "backend/backend.h"
#include "op_table.h"

namespace ptrain::test {
namespace {

TEST_CASE("op table: each case is labelled once and each family has cases", "[ops][op-table]") {
  std::set<std::string> labels;
  for (const OpCase& c : op_cases()) {
    INFO(c.label);
    CHECK(labels.insert(c.label).second);
    CHECK(!c.operands.empty());
  }
  for (const std::string& family : op_families()) CHECK(!op_cases(family).empty());
  CHECK_THROWS_AS(op_cases("no such family"), std::logic_error);
}

TEST_CASE("op table: every case gives the same bits on the CPU backend at 1 and 3 threads", "[ops][op-table]") {
  const auto one = make_cpu_backend(1), three = make_cpu_backend(3);
  for (const OpCase& c : op_cases())
    for (const OperandResult& r : run_op_case(c, *one, *three)) {
      size_t first = 0, unwritten = 0;
      const size_t differ = bit_differences(r.reference, r.tested, &first);
      for (const float x : r.reference) unwritten += std::isnan(x);
      INFO(c.label << ", " << r.operand->name << ": " << differ << " of " << r.reference.size()
                   << " elements differ between 1 and 3 threads"
                   << (differ ? ", first at " + std::to_string(first) : std::string()) << "; " << unwritten
                   << " left NaN");
      CHECK(differ == 0);
      CHECK(unwritten == 0);
    }
}

}  // namespace
}  // namespace ptrain::test
