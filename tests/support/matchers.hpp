// SPDX-License-Identifier: Apache-2.0
#pragma once
// Error assertions that check the type and the message together:
//   REQUIRE_THROWS_MATCHES(expr, mirror::shape_error, mirror::test::what(Catch::Contains("...")))
// (REQUIRE_THROWS_WITH alone passes for any exception type with the right text.)

#include <catch2/catch.hpp>
#include <exception>
#include <string>
#include <utility>

namespace mirror::test {

/// Matches an exception whose what() the string matcher `M` accepts.
template <class M>
class what_matcher : public Catch::MatcherBase<std::exception> {
 public:
  explicit what_matcher(M m) : m_(std::move(m)) {}
  bool match(const std::exception& e) const override { return m_.match(std::string(e.what())); }
  std::string describe() const override { return "what() " + m_.toString(); }

 private:
  M m_;
};

template <class M>
what_matcher<M> what(M m) {
  return what_matcher<M>(std::move(m));
}
/// what() equals `text`.
inline auto what(const char* text) { return what(Catch::Equals(text)); }

}  // namespace mirror::test
