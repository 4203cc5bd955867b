// Errors ptrain reports to users. Every failure a user can cause (bad config, bad data, bad
// flags) is a UserError: the CLI prints its message and exits with code 2. Anything else is a
// bug or an environment failure and exits with code 1.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace ptrain {

class UserError : public std::runtime_error {
 public:
  explicit UserError(const std::string& message) : std::runtime_error(message) {}
};

// Several problems found together (a config is validated completely before reporting).
class UserErrors : public UserError {
 public:
  explicit UserErrors(std::vector<std::string> problems);
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  std::vector<std::string> problems_;
};

// The machine failed a run the user set up correctly (a full disk, a failed write): reported
// without "internal error", exit code 1.
class EnvironmentError : public std::runtime_error {
 public:
  explicit EnvironmentError(const std::string& message) : std::runtime_error(message) {}
};

// Internal invariant violated: a bug in ptrain, not in the user's input.
#define PTRAIN_CHECK(cond, msg)                                                              \
  do {                                                                                       \
    if (!(cond))                                                                             \
      throw std::logic_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " + \
                             (msg));                                                         \
  } while (0)

}  // namespace ptrain
