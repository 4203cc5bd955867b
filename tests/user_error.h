// The message of the UserError a call throws, for tests of refusals.
#pragma once

#include <catch2/catch.hpp>

#include <string>

#include "core/error.h"

namespace ptrain::test {

// The message of the UserError `f` throws (fails the test if it throws nothing or another type).
template <typename F>
std::string user_error(F f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  FAIL("expected a UserError");
  return "";
}

}  // namespace ptrain::test
