// Test helper shared by the core tests: the message of an expected InvalidArgument.
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

#include "poseidon/common/error.h"

namespace poseidon {

// Runs `fn`, expects it to throw InvalidArgument, and returns the message, so that tests can
// assert on what the user would read. Anything else (another exception, or nothing) fails the
// test and returns "".
template <typename Fn>
std::string invalidArgumentMessage(Fn fn) {
  try {
    fn();
  } catch (const InvalidArgument& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InvalidArgument, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected InvalidArgument, nothing was thrown";
  return "";
}

}  // namespace poseidon
