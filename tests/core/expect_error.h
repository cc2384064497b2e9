// Test helpers shared by the core tests: the message of an expected error.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <typeinfo>

#include "poseidon/common/error.h"

namespace poseidon {

// Runs `fn`, expects it to throw E (or a subclass), and returns the message, so that tests can
// assert on what the user would read. Anything else (another exception, or nothing) fails the
// test and returns "".
template <typename E, typename Fn>
std::string errorMessage(Fn fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected " << typeid(E).name() << ", got " << typeid(e).name() << ": " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected " << typeid(E).name() << ", nothing was thrown";
  return "";
}

template <typename Fn>
std::string invalidArgumentMessage(Fn fn) {
  return errorMessage<InvalidArgument>(fn);
}

}  // namespace poseidon

// EXPECT_ERROR_CONTAINS(statement, ErrorType, "text"): the statement throws ErrorType whose
// message contains the text.
#define EXPECT_ERROR_CONTAINS(statement, ErrorType, text) \
  EXPECT_THAT(::poseidon::errorMessage<ErrorType>([&] { statement; }), ::testing::HasSubstr(text))
