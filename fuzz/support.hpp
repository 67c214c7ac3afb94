#pragma once
// What the operator harnesses share: reading a call's arguments from the fuzzer's bytes, tensors
// with canaries around them (tests/support/test_tensor.hpp), and the three outcomes a call may
// have: an Error that left every output untouched, or success with every canary intact and
// (where the inputs are finite and in range) outputs within the test suite's tolerance of the
// fp64 reference (tests/reference). Anything else (a crash, a sanitizer report, another exception
// type, a wrong answer) aborts, which libFuzzer reports with the input that did it.

#include <fuzzer/FuzzedDataProvider.h>
#include <sanitizer/common_interface_defs.h>
#include <unistd.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ditops/runtime.hpp>
#include <ditops/tensor.hpp>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/support/test_tensor.hpp"
#include "tests/support/tolerance.hpp"

namespace ditops::fuzz {

using test::TestTensor;
using test::Tolerance;

/// Reports `what` and aborts. Through the sanitizer's report stream: tools/fuzz.sh closes the
/// harness's stderr (the warnings inputs provoke on purpose), libFuzzer keeps that stream open.
[[noreturn]] inline void failure(const std::string& what) {
  __sanitizer_report_error_summary(("ditops fuzz: " + what).c_str());
  std::abort();
}

/// The fuzzer's bytes as call arguments. Sizes are small (each run takes microseconds), values
/// come from a seeded generator (the bytes choose the shapes, options and special values, not
/// every element).
class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : bytes_(data, size) {}

  std::int64_t size(std::int64_t low, std::int64_t high) {
    return bytes_.ConsumeIntegralInRange<std::int64_t>(low, high);
  }
  bool flag() { return bytes_.ConsumeBool(); }
  /// True about once in `n` calls (never when the bytes have run out).
  bool rarely(int n = 16) { return bytes_.ConsumeIntegralInRange<int>(0, n - 1) == n - 1; }
  template <class T>
  T pick(std::initializer_list<T> values) {
    return values.begin()[bytes_.ConsumeIntegralInRange<std::size_t>(0, values.size() - 1)];
  }
  std::uint32_t seed() { return bytes_.ConsumeIntegral<std::uint32_t>(); }
  /// A float that is mostly ordinary, sometimes an edge value (0, subnormal, huge, NaN, inf).
  float edge_float(float ordinary) {
    switch (bytes_.ConsumeIntegralInRange<int>(0, 15)) {
      case 0:
        return 0.f;
      case 1:
        return -ordinary;
      case 2:
        return std::numeric_limits<float>::quiet_NaN();
      case 3:
        return std::numeric_limits<float>::infinity();
      case 4:
        return FLT_MAX;
      case 5:
        return FLT_MIN / 4;  // subnormal
      case 6:
        return bytes_.ConsumeFloatingPoint<float>();
      default:
        return ordinary;
    }
  }

 private:
  FuzzedDataProvider bytes_;
};

/// Normal floats (mean 0, stddev 1) by Box-Muller on 24-bit uniforms, in float. Not
/// std::normal_distribution: libstdc++'s generate_canonical computes a long double logarithm of
/// the generator's range for every uniform it draws, which gcc folds and clang does not; that
/// was a third of an operator harness's time. Tails end at 5.8 stddev.
class Normal {
 public:
  float operator()(std::mt19937& rng) {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    constexpr float kTwoPi = 6.28318530717958647692f;
    const float u1 = (static_cast<float>(rng() >> 8) + 1.f) * 0x1p-24f;  // (0, 1]
    const float u2 = static_cast<float>(rng() >> 8) * 0x1p-24f;          // [0, 1)
    const float radius = std::sqrt(-2.f * std::log(u1));
    spare_ = radius * std::sin(kTwoPi * u2);
    has_spare_ = true;
    return radius * std::cos(kTwoPi * u2);
  }

 private:
  float spare_ = 0.f;
  bool has_spare_ = false;
};

/// True with probability `p` (std::bernoulli_distribution draws through generate_canonical too).
inline bool chance(std::mt19937& rng, float p) {
  return static_cast<float>(rng() >> 8) * 0x1p-24f < p;
}

/// Normal values (mean 0, stddev 1), and with `specials` one NaN or infinity somewhere.
template <class T>
void fill(TestTensor<T>& t, std::mt19937& rng, bool specials = false) {
  Normal normal;
  for (std::int64_t i = 0; i < t.size(); ++i) t.at(i) = from_float<T>(normal(rng));
  if (specials && t.size() > 0) {
    std::uniform_int_distribution<std::int64_t> at(0, t.size() - 1);
    const float special = rng() % 2 ? std::numeric_limits<float>::quiet_NaN()
                                    : std::numeric_limits<float>::infinity();
    t.at(at(rng)) = from_float<T>(special);
  }
}

/// Runs `call`; false when it threw ditops::Error. Any other exception escapes to libFuzzer,
/// which reports it as a crash.
template <class Call>
bool accepted(Call&& call) {
  try {
    call();
    return true;
  } catch (const Error&) {
    return false;
  }
}

template <class T>
void expect_canaries(const TestTensor<T>& t, const std::string& name) {
  if (const std::int64_t damaged = t.damaged_canaries()) {
    failure(name + ": " + std::to_string(damaged) + " elements written outside the tensor");
  }
}

template <class T>
void expect_unchanged(const TestTensor<T>& t, const std::vector<T>& before,
                      const std::string& name) {
  if (!t.unchanged_since(before)) failure(name + " written by a call that threw Error");
}

/// |got - ref| <= atol + rtol |ref| element by element, as the test suite compares; a NaN
/// fails, except where the reference itself is NaN from finite inputs (the documented formula's
/// 0 * inf, as RMSNorm of an all-zero row with eps 0): there the output must be NaN too.
template <class T>
void check_close(const TestTensor<T>& got, const std::vector<double>& ref, Tolerance tol,
                 const std::string& context) {
  for (std::int64_t i = 0; i < got.size(); ++i) {
    const double value = got.value(i), want = ref[static_cast<std::size_t>(i)];
    if (std::isnan(want) && std::isnan(value)) continue;
    if (!test::within(value, want, tol)) {
      failure(context + ": element " + std::to_string(i) + " is " + std::to_string(value) +
              ", the reference " + std::to_string(want));
    }
  }
}

/// A path for this process's scratch file `stem` (the harnesses that read files write each input
/// to one), on a RAM file system where there is one: inputs are written thousands of times.
inline std::string scratch_path(const std::string& stem) {
  const char* dir = std::getenv("TMPDIR");
  const std::string root =
      access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (dir && *dir ? dir : "/tmp");
  return root + "/" + stem + "." + std::to_string(::getpid());
}

/// 1 or 2 threads.
inline void set_threads(Input& in) { set_num_threads(static_cast<int>(in.size(1, 2))); }

}  // namespace ditops::fuzz
