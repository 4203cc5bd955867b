#include "core/error.h"

namespace ptrain {

static std::string join_problems(const std::vector<std::string>& problems) {
  std::string text = std::to_string(problems.size()) +
                     (problems.size() == 1 ? " problem:" : " problems:");
  for (const auto& p : problems) text += "\n  - " + p;
  return text;
}

UserErrors::UserErrors(std::vector<std::string> problems)
    : UserError(join_problems(problems)), problems_(std::move(problems)) {}

}  // namespace ptrain
