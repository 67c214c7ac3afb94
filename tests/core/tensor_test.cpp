// view() construction, dtype deduction, and the scalar bf16/f16 conversions (checked against an
// independent nearest-even rounding computed in double).

#include <bit>
#include <cmath>
#include <ditops/tensor.hpp>
#include <limits>
#include <random>

#include "tests/support/test_tensor.hpp"

namespace ditops::test {
namespace {

TEST(View, RowMajorStridesAndDtype) {
  float data[24];
  const TensorView v = view(data, {2, 3, 4});
  EXPECT_EQ(v.rank, 3);
  EXPECT_EQ(v.dtype, DType::f32);
  EXPECT_EQ(v.strides[0], 12);
  EXPECT_EQ(v.strides[1], 4);
  EXPECT_EQ(v.strides[2], 1);
  const bf16 halves[4]{};
  EXPECT_EQ(view(halves, {4}).dtype, DType::bf16);  // const T* accepted
  std::int8_t bytes[4];
  EXPECT_EQ(view(bytes, {4}).dtype, DType::i8);
  bool mask[4];
  EXPECT_EQ(view(mask, {2, 2}).dtype, DType::boolean);
  const TensorView strided = view(data, {2, 3}, {12, 1});
  EXPECT_EQ(strided.strides[0], 12);
  EXPECT_THROW(view(data, {2, 3}, {1}), Error);
  EXPECT_THROW(view(data, {1, 1, 1, 1, 1, 1, 1}), Error);
  EXPECT_TRUE(TensorView{}.empty());
}

/// The representable neighbours of `value` below and above, chosen with ties to even.
double nearest_even(double value, double lower, double upper, bool lower_is_even) {
  const double down = value - lower, up = upper - value;
  if (down < up) return lower;
  if (up < down) return upper;
  return lower_is_even ? lower : upper;
}

TEST(Bf16, RoundsToNearestEvenAndKeepsSpecials) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<std::uint32_t> bits;
  for (int i = 0; i < 200000; ++i) {
    const float value = std::bit_cast<float>(bits(rng));
    if (!std::isfinite(value)) continue;
    const std::uint32_t truncated = std::bit_cast<std::uint32_t>(value) & 0xffff0000u;
    const double lower = std::bit_cast<float>(truncated);
    double upper = std::bit_cast<float>(truncated + 0x10000u);
    if (std::isinf(upper)) upper = std::ldexp(1.0, 128);  // rounding up past the max gives inf
    double toward = nearest_even(std::fabs(value), std::fabs(lower), std::fabs(upper),
                                 ((truncated >> 16) & 1u) == 0);
    if (toward == std::ldexp(1.0, 128)) toward = INFINITY;
    const float got = bf16::from_float(value).to_float();
    EXPECT_EQ(std::fabs(static_cast<double>(got)), toward) << "value " << value;
    EXPECT_EQ(std::signbit(got), std::signbit(value));
  }
  EXPECT_TRUE(std::isnan(bf16::from_float(std::numeric_limits<float>::quiet_NaN()).to_float()));
  EXPECT_TRUE(std::isnan(bf16::from_float(std::bit_cast<float>(0x7fffffffu)).to_float()));
  EXPECT_EQ(bf16::from_float(INFINITY).to_float(), INFINITY);
  EXPECT_EQ(bf16::from_float(3.3962e38f).to_float(), INFINITY);  // past max + half ulp
  EXPECT_EQ(bf16::from_float(3.3895314e38f).bits, 0x7f7f);       // the max itself
  EXPECT_EQ(from_float<bf16>(1.5f).bits, 0x3fc0);
  EXPECT_EQ(to_float(bf16{0x3fc0}), 1.5f);
}

TEST(F16, EveryPatternRoundTripsAndRoundingIsNearestEven) {
  for (std::uint32_t pattern = 0; pattern < 0x10000u; ++pattern) {
    const f16 h{static_cast<std::uint16_t>(pattern)};
    const float value = h.to_float();
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(f16::from_float(value).to_float()));
      continue;
    }
    EXPECT_EQ(f16::from_float(value).bits, h.bits) << "pattern " << pattern;
    // Midpoint to the next pattern of the same sign (finite, non-max): ties go to even.
    const std::uint32_t magnitude = pattern & 0x7fffu;
    if (magnitude >= 0x7bffu) continue;
    const double lower = std::fabs(static_cast<double>(value));
    const double upper =
        std::fabs(static_cast<double>(f16{static_cast<std::uint16_t>(pattern + 1)}.to_float()));
    const double midpoint = (lower + upper) / 2;  // exact in float for f16 neighbours
    const float mid = std::copysign(static_cast<float>(midpoint), value);
    const std::uint16_t even = (magnitude & 1u) ? static_cast<std::uint16_t>(pattern + 1) : h.bits;
    EXPECT_EQ(f16::from_float(mid).bits, even) << "tie after pattern " << pattern;
    const float above = std::nextafter(mid, std::copysign(INFINITY, value));
    EXPECT_EQ(f16::from_float(above).bits, static_cast<std::uint16_t>(pattern + 1));
  }
  EXPECT_EQ(f16::from_float(65520.f).bits, 0x7c00);  // tie between 65504 and 2^16: infinity
  EXPECT_EQ(f16::from_float(65519.f).bits, 0x7bff);
  EXPECT_EQ(f16::from_float(1e-9f).bits, 0);
  EXPECT_EQ(f16::from_float(-1e-9f).bits, 0x8000);
}

}  // namespace
}  // namespace ditops::test
