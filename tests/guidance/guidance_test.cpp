// cfg_combine against its formula in fp64, for every dtype, rows with tails and strides, in
// place, 1 and 2 threads; the same bits at every offset within a cache line; bad arguments.

#include <gtest/gtest.h>

#include <cmath>
#include <ditops/guidance.hpp>
#include <ditops/runtime.hpp>
#include <random>

#include "tests/support/expect_rejected.hpp"
#include "tests/support/line_offsets.hpp"
#include "tests/support/scoped_threads.hpp"
#include "tests/support/test_tensor.hpp"

namespace ditops::test {
namespace {

// In fp32: cond - uncond rounds once (2^-24 of |cond| + |uncond|, then scaled), the FMA once
// (2^-24 of the result), or on SSE levels, which have no FMA, the product and the sum once each:
// at most three roundings of terms bounded by |uncond| + |scale| (|cond| + |uncond|), which
// 2^-22 of it covers. A 16-bit output adds its rounding: 2^-8 (bf16) or 2^-11 (f16) of the value.
template <class T>
double output_rounding() {
  if constexpr (std::is_same_v<T, bf16>) return 0x1p-8;
  if constexpr (std::is_same_v<T, f16>) return 0x1p-11;
  return 0.0;
}

template <class T>
void check_combine(bool in_place) {
  std::mt19937 rng(31);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (std::int64_t dim : {1, 7, 8, 15, 16, 17, 33, 3072}) {
      const std::vector<std::int64_t> shape = {2, 3, dim};
      TestTensor<T> cond(shape, 3), uncond(shape, 1), out(shape);
      cond.fill_normal(rng);
      uncond.fill_normal(rng);
      const float scale = 3.5f;
      std::vector<double> c(cond.size()), u(uncond.size());
      for (std::int64_t i = 0; i < cond.size(); ++i) {
        c[static_cast<std::size_t>(i)] = cond.value(i);
        u[static_cast<std::size_t>(i)] = uncond.value(i);
      }
      TestTensor<T>& result = in_place ? cond : out;
      cfg_combine(cond.view(), uncond.view(), scale, result.view());
      ASSERT_EQ(result.damaged_canaries(), 0);
      for (std::int64_t i = 0; i < result.size(); ++i) {
        const double cv = c[static_cast<std::size_t>(i)], uv = u[static_cast<std::size_t>(i)];
        const double want = uv + scale * (cv - uv);
        const double tolerance =
            0x1p-22 * (std::fabs(uv) + scale * (std::fabs(cv) + std::fabs(uv))) +
            output_rounding<T>() * std::fabs(want);
        ASSERT_NEAR(result.value(i), want, tolerance) << "dim " << dim << " at " << i;
      }
    }
  }
  set_num_threads(0);
}

TEST(CfgCombine, F32) { check_combine<float>(false); }
TEST(CfgCombine, F32InPlace) { check_combine<float>(true); }
TEST(CfgCombine, Bf16) { check_combine<bf16>(false); }
TEST(CfgCombine, F16InPlace) { check_combine<f16>(true); }

// Buffers as users allocate them: cond, uncond and out at every offset within a cache line (16
// bytes past one is where malloc and numpy put large arrays) give the aligned run's bits, with
// nothing written outside out. Rows of 3072 (a DiT's hidden size) and 19 (tails at both ends of
// short rows), 2 threads splitting them.
template <class T>
void expect_every_line_offset_equal(std::int64_t dim) {
  const ScopedThreads threads(2);
  const std::int64_t rows = 24;
  const auto count = static_cast<std::size_t>(rows * dim);
  std::vector<T> cond0(count), uncond0(count);
  std::mt19937 rng(32);
  std::normal_distribution<float> normal;
  for (std::size_t i = 0; i < count; ++i) {
    cond0[i] = from_float<T>(normal(rng));
    uncond0[i] = from_float<T>(normal(rng));
  }
  OffsetBuffer<T> cond(count), uncond(count), out(count);
  const auto run = [&](std::size_t offset) {
    T* result = out.place(offset);
    cfg_combine(view(cond.place_copy(offset, cond0), {rows, dim}),
                view(uncond.place_copy(offset, uncond0), {rows, dim}), 4.5f,
                view(result, {rows, dim}));
    EXPECT_TRUE(out.guards_intact()) << "offset " << offset;
    return bytes_of(result, count);
  };
  expect_every_offset_equals_aligned(sizeof(T), run,
                                     std::string("cfg_combine ") +
                                         dtype_name(detail::dtype_of<T>()) + " D " +
                                         std::to_string(dim));
}

TEST(CfgCombineLineOffsets, EveryOffsetEqualsTheAlignedRun) {
  for (const std::int64_t dim : {3072, 19}) {
    expect_every_line_offset_equal<float>(dim);
    expect_every_line_offset_equal<bf16>(dim);
    expect_every_line_offset_equal<f16>(dim);
  }
}

TEST(CfgCombine, RejectsBadArguments) {
  TestTensor<float> cond({2, 8}), uncond({2, 8}), out({2, 8}), wrong({2, 9});
  TestTensor<bf16> other_dtype({2, 8});
  expect_rejected([&] { cfg_combine(cond.view(), wrong.view(), 1.f, out.view()); }, "uncond", out);
  expect_rejected([&] { cfg_combine(cond.view(), uncond.view(), 1.f, other_dtype.view()); }, "out",
                  other_dtype);
  expect_rejected([&] { cfg_combine(cond.view(), uncond.view(), NAN, out.view()); }, "scale", out);
  TensorView shifted = cond.view();
  shifted.data = static_cast<float*>(shifted.data) + 1;  // overlaps cond without being it
  expect_rejected([&] { cfg_combine(cond.view(), uncond.view(), 1.f, shifted); }, "overlap", cond);
}

}  // namespace
}  // namespace ditops::test
