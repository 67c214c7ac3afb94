#pragma once
// The bad-input check every operator test uses: the call throws ditops::Error, the message
// names the argument (`needle`), and the output was not touched before the throw.

#include <gtest/gtest.h>

#include <string>

#include "tests/support/test_tensor.hpp"

namespace ditops::test {

template <class Call, class T>
void expect_rejected(Call&& call, const std::string& needle, const TestTensor<T>& out) {
  const auto before = out.snapshot();
  try {
    call();
    ADD_FAILURE() << "no ditops::Error for: " << needle;
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos)
        << "message '" << error.what() << "' does not name " << needle;
  }
  EXPECT_TRUE(out.unchanged_since(before)) << needle << ": output touched before the error";
}

}  // namespace ditops::test
