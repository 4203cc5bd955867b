#include "train/step_faults.h"

#include <cstdlib>
#include <sstream>
#include <string>

#include "core/error.h"

namespace ptrain {

namespace {

constexpr const char* kVariable = "PTRAIN_TEST_FAULT";

[[noreturn]] void refuse(const std::string& item, const std::string& why) {
  throw UserError(std::string(kVariable) + ": \"" + item + "\" " + why +
                  "; expected KIND:STEP:FACTOR[:TIMES] items separated by commas, KIND loss or grad, STEP >= 1, "
                  "FACTOR a number, inf or nan, TIMES >= 1");
}

// The whole of `text` as a number of type T, or refuse `item`.
template <typename T>
T parse_whole(const std::string& text, const std::string& item, const char* what) {
  std::istringstream in(text);
  T value{};
  if (text.empty() || !(in >> value) || !in.eof()) refuse(item, std::string("has no ") + what);
  return value;
}

}  // namespace

StepFaults StepFaults::from_environment() {
  StepFaults faults;
  const char* spec = std::getenv(kVariable);
  if (!spec || !*spec) return faults;
  std::istringstream items(spec);
  std::string item;
  while (std::getline(items, item, ',')) {
    std::vector<std::string> parts;
    std::istringstream fields(item);
    for (std::string f; std::getline(fields, f, ':');) parts.push_back(f);
    if (parts.size() < 3 || parts.size() > 4) refuse(item, "is not KIND:STEP:FACTOR[:TIMES]");
    Fault f{};
    if (parts[0] == "loss") f.kind = Kind::loss;
    else if (parts[0] == "grad") f.kind = Kind::grad;
    else refuse(item, "names no kind of fault");
    f.step = parse_whole<int64_t>(parts[1], item, "step");
    if (f.step < 1) refuse(item, "has no step");
    // strtod reads inf and nan, which the stream does not.
    char* end = nullptr;
    f.factor = std::strtod(parts[2].c_str(), &end);
    if (parts[2].empty() || *end != '\0') refuse(item, "has no factor");
    f.times_left = parts.size() == 4 ? parse_whole<int>(parts[3], item, "count of times") : 1;
    if (f.times_left < 1) refuse(item, "has no count of times");
    faults.faults_.push_back(f);
  }
  return faults;
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
