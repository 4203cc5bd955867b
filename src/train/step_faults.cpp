#include "train/step_faults.h"

#include <cmath>
#include <cstdlib>
#include <regex>
#include <string>

#include "core/error.h"

namespace ptrain {

namespace {

constexpr const char* kVariable = "PTRAIN_TEST_FAULT";

[[noreturn]] void refuse(const std::string& item, const std::string& why) {
  throw UserError(std::string(kVariable) + ": \"" + item + "\" " + why +
                  "; expected KIND:STEP:FACTOR[:TIMES] items separated by commas, KIND loss, grad or signal, "
                  "STEP >= 1, FACTOR a number, inf or nan (for signal a micro-batch >= 1), TIMES >= 1");
}

}  // namespace

StepFaults StepFaults::from_environment() {
  const char* spec = std::getenv(kVariable);
  return parse(spec ? spec : "");
}

StepFaults StepFaults::parse(const std::string& spec) {
  StepFaults faults;
  if (spec.empty()) return faults;
  // Whole items only: no spaces, signs on counts, hexadecimal or empty items (a trailing comma).
  static const std::regex item_form(
      R"((loss|grad|signal):([1-9][0-9]{0,17}):([-+]?(inf|nan|[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?))(:([1-9][0-9]{0,8}))?)");
  const std::string text = spec;
  size_t start = 0;
  for (;;) {
    const size_t end = text.find(',', start);
    const std::string item = text.substr(start, end == std::string::npos ? std::string::npos : end - start);
    std::smatch m;
    if (!std::regex_match(item, m, item_form)) refuse(item, "is not a fault");
    const Kind kind = m[1] == "loss" ? Kind::loss : m[1] == "grad" ? Kind::grad : Kind::signal;
    const double factor = std::strtod(m[3].str().c_str(), nullptr);  // overflow: inf, a factor too
    if (kind == Kind::signal && !(factor >= 1 && factor <= 1e9 && factor == std::floor(factor)))
      refuse(item, "names no micro-batch");
    faults.faults_.push_back({kind, std::stoll(m[2].str()), factor, m[8].matched ? std::stoi(m[8].str()) : 1});
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return faults;
}

bool StepFaults::signal_after(int64_t step, int micro) {
  for (Fault& f : faults_)
    if (f.kind == Kind::signal && f.step == step && f.factor == micro && f.times_left > 0) {
      --f.times_left;
      return true;
    }
  return false;
}

double StepFaults::fire(Kind kind, int64_t step) {
  double factor = 1;
  for (Fault& f : faults_)
    if (f.kind == kind && f.step == step && f.times_left > 0) {
      factor *= f.factor;
      --f.times_left;
    }
  return factor;
}

}  // namespace ptrain
