#pragma once
// The thread count operators use, set for one scope and restored after it.

#include <ditops/runtime.hpp>

namespace ditops::test {

class ScopedThreads {
 public:
  explicit ScopedThreads(int threads) : before_(num_threads()) { set_num_threads(threads); }
  ~ScopedThreads() { set_num_threads(before_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int before_;
};

}  // namespace ditops::test
