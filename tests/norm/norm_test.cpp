// rms_norm and add_rms_norm against the fp64 reference, on every dtype, over D sweeps with tails,
// strided rows, in place, 1 and 2 threads; and every class of bad input.

#include <bit>
#include <cmath>
#include <cstring>
#include <ditops/norm.hpp>
#include <ditops/runtime.hpp>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "tests/reference/norm_ref.hpp"
#include "tests/support/expect_rejected.hpp"
#include "tests/support/line_offsets.hpp"
#include "tests/support/tolerance.hpp"

namespace ditops::test {
namespace {

// Model widths (DiT and LLM hidden sizes and head dims) plus sizes that leave a tail for every
// vector width (4, 8, 16 lanes) and the 4-vector unroll.
const std::int64_t kDims[] = {1, 7, 8, 17, 33, 64, 72, 80, 96, 128, 256, 3072, 5120, 4104};
// Row counts around the 4-row passes of short rows (norm::rows_per_pass): a lone row, fewer
// than a pass, one pass and a 2-row tail, two passes and a 1-row tail across two leading dims.
const std::vector<std::int64_t> kLeading[] = {{1}, {3}, {2, 3}, {3, 3}};
constexpr float kEps = 1e-6f;

enum class WeightKind { none, f32, same_dtype };

template <class T>
struct NormCase {
  std::vector<std::int64_t> shape;
  std::int64_t pad;
  WeightKind weight_kind;
  int threads;
  bool fused;
  bool in_place;

  std::string describe() const {
    std::string s = std::string(fused ? "add_rms_norm" : "rms_norm") + " " +
                    dtype_name(detail::dtype_of<T>()) + " shape [";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
    return s + "] pad " + std::to_string(pad) + " weight " +
           std::to_string(static_cast<int>(weight_kind)) + " threads " + std::to_string(threads) +
           (in_place ? " in-place" : "") + " isa " + active_isa_name();
  }

  /// Runs the case; returns the output (and sum) tensors for comparisons across runs.
  void run_and_check(std::mt19937& rng) const {
    set_num_threads(threads);
    const std::int64_t dim = shape.back();
    TestTensor<T> x(shape, pad), residual(shape, pad + 1), out(shape, pad), sum(shape, pad);
    x.fill_normal(rng, 0.3f, 1.5f);
    residual.fill_normal(rng, -0.2f, 1.f);
    TestTensor<float> weight_f32({dim});
    TestTensor<T> weight_same({dim});
    weight_f32.fill_normal(rng, 1.f, 0.5f);
    for (std::int64_t i = 0; i < dim; ++i) weight_same.at(i) = from_float<T>(weight_f32.value(i));
    std::vector<double> weight;
    TensorView weight_view{};
    if (weight_kind == WeightKind::f32) {
      for (std::int64_t i = 0; i < dim; ++i) weight.push_back(weight_f32.value(i));
      weight_view = weight_f32.view();
    } else if (weight_kind == WeightKind::same_dtype) {
      for (std::int64_t i = 0; i < dim; ++i) weight.push_back(weight_same.value(i));
      weight_view = weight_same.view();
    }
    const NormReference ref = norm_reference(x, fused ? &residual : nullptr, weight, kEps);
    const Tolerance tol = rowwise_tolerance<T>();
    if (!fused) {
      if (in_place) {
        rms_norm(x.view(), weight_view, kEps, x.view());
        expect_close(x, ref.out, tol, describe());
      } else {
        rms_norm(x.view(), weight_view, kEps, out.view());
        expect_close(out, ref.out, tol, describe());
      }
      return;
    }
    if (in_place) {  // the transformer-block pattern: residual stream updated, x reused for out
      add_rms_norm(x.view(), residual.view(), weight_view, kEps, x.view(), residual.view());
      expect_close(x, ref.out, tol, describe() + " out");
      expect_close(residual, ref.sum, tol, describe() + " sum_out");
    } else {
      add_rms_norm(x.view(), residual.view(), weight_view, kEps, out.view(), sum.view());
      expect_close(out, ref.out, tol, describe() + " out");
      expect_close(sum, ref.sum, tol, describe() + " sum_out");
    }
  }
};

template <class T>
class NormTest : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, bf16, f16>;
TYPED_TEST_SUITE(NormTest, FloatTypes);

TYPED_TEST(NormTest, MatchesReferenceOverSweep) {
  std::mt19937 rng(1234);
  for (std::int64_t dim : kDims) {
    for (const auto& leading : kLeading) {
      std::vector<std::int64_t> shape = leading;
      shape.push_back(dim);
      for (std::int64_t pad : {0, 5}) {
        for (WeightKind weight : {WeightKind::none, WeightKind::f32, WeightKind::same_dtype}) {
          for (bool fused : {false, true}) {
            for (bool in_place : {false, true}) {
              NormCase<TypeParam>{shape, pad, weight, 1, fused, in_place}.run_and_check(rng);
            }
          }
        }
      }
    }
  }
}

// Shapes large enough that the row split really uses two threads (> 512 KiB streamed).
TYPED_TEST(NormTest, TwoThreadsMatchReferenceAndOneThreadBitwise) {
  std::mt19937 rng(99);
  for (const auto& shape : std::vector<std::vector<std::int64_t>>{{67, 3072}, {3, 5, 4104}}) {
    for (bool fused : {false, true}) {
      NormCase<TypeParam>{shape, 3, WeightKind::f32, 2, fused, false}.run_and_check(rng);
      // Rows are independent, so the thread count must not change a single bit.
      TestTensor<TypeParam> x(shape), residual(shape), out1(shape), out2(shape), sum1(shape),
          sum2(shape);
      x.fill_normal(rng);
      residual.fill_normal(rng);
      for (int threads : {1, 2}) {
        set_num_threads(threads);
        auto& out = threads == 1 ? out1 : out2;
        auto& sum = threads == 1 ? sum1 : sum2;
        if (fused) {
          add_rms_norm(x.view(), residual.view(), {}, kEps, out.view(), sum.view());
        } else {
          rms_norm(x.view(), {}, kEps, out.view());
        }
      }
      EXPECT_TRUE(out2.unchanged_since(out1.snapshot())) << "thread count changed the result";
      EXPECT_TRUE(sum2.unchanged_since(sum1.snapshot())) << "thread count changed sum_out";
    }
  }
}

// Exact ties: with x = +-1 and eps = 0 the scale is exactly 1, so out = weight in fp32 and the
// store must round it to nearest even (vector lanes and tail lanes alike).
TEST(NormRounding, NarrowOutputRoundsToNearestEven) {
  constexpr std::int64_t kDim = 37;  // two AVX-512 vectors and a tail
  TestTensor<float> weight({kDim});
  TestTensor<bf16> xb({1, kDim}), outb({1, kDim});
  TestTensor<f16> xh({1, kDim}), outh({1, kDim});
  const float bf16_ties[] = {1.f + 0x1p-8f, 1.f + 3 * 0x1p-8f, -(1.f + 0x1p-8f), 1.f + 0x1p-9f};
  const float bf16_want[] = {1.f, 1.f + 0x1p-6f, -1.f, 1.f};
  const float f16_ties[] = {1.f + 0x1p-11f, 1.f + 3 * 0x1p-11f, -(1.f + 3 * 0x1p-11f), 2.f};
  const float f16_want[] = {1.f, 1.f + 0x1p-9f, -(1.f + 0x1p-9f), 2.f};
  for (int kind = 0; kind < 2; ++kind) {
    for (std::int64_t i = 0; i < kDim; ++i) {
      weight.at(i) = kind == 0 ? bf16_ties[i % 4] : f16_ties[i % 4];
      xb.at(i) = bf16::from_float(i % 3 ? 1.f : -1.f);
      xh.at(i) = f16::from_float(i % 3 ? 1.f : -1.f);
    }
    if (kind == 0) {
      rms_norm(xb.view(), weight.view(), 0.f, outb.view());
    } else {
      rms_norm(xh.view(), weight.view(), 0.f, outh.view());
    }
    for (std::int64_t i = 0; i < kDim; ++i) {
      const float sign = i % 3 ? 1.f : -1.f;
      if (kind == 0) {
        EXPECT_EQ(outb.value(i), sign * bf16_want[i % 4]) << "bf16 element " << i;
      } else {
        EXPECT_EQ(outh.value(i), sign * f16_want[i % 4]) << "f16 element " << i;
      }
    }
  }
}

TEST(NormProperties, ScaleInvariant) {  // rms_norm(c·x) = rms_norm(x) for c > 0 (eps = 0)
  std::mt19937 rng(5);
  TestTensor<float> x({4, 100}), scaled({4, 100}), a({4, 100}), b({4, 100});
  x.fill_normal(rng);
  for (std::int64_t i = 0; i < x.size(); ++i) scaled.at(i) = 8.f * x.at(i);
  rms_norm(x.view(), {}, 0.f, a.view());
  rms_norm(scaled.view(), {}, 0.f, b.view());
  for (std::int64_t i = 0; i < x.size(); ++i) EXPECT_NEAR(a.value(i), b.value(i), 1e-6);
}

// Rows near the ends of fp32: squares of |x| ~ 2^70 overflow the fp32 sum (the output was 0),
// squares of |x| ~ 2^-70 underflow it (with eps = 0 the output was inf or NaN). Every row is
// still x / rms(x) within the usual tolerance, plain and fused, f32 and bf16 (f16 cannot hold
// such values), 1 and 2 threads; a row of normal values beside them takes the vector path.
template <class T>
void check_extreme_rows() {
  std::mt19937 rng(71);
  for (const bool fused : {false, true}) {
    for (const float eps : {0.f, 1e-6f}) {
      for (const int threads : {1, 2}) {
        set_num_threads(threads);
        TestTensor<T> x({5, 37}), residual({5, 37}), out({5, 37}), sum({5, 37});
        x.fill_normal(rng);
        const float magnitude[5] = {0x1p70f, 0x1p-70f, 1.f, 0x1p124f, 0x1p-120f};
        for (std::int64_t i = 0; i < x.size(); ++i) {
          x.at(i) = from_float<T>(to_float(x.at(i)) * magnitude[i / 37]);
          residual.at(i) = from_float<T>(0.f);
        }
        const NormReference ref = norm_reference(x, fused ? &residual : nullptr, {}, eps);
        if (fused) {
          add_rms_norm(x.view(), residual.view(), {}, eps, out.view(), sum.view());
        } else {
          rms_norm(x.view(), {}, eps, out.view());
        }
        // Rows whose mean square is below eps are eps-dominated: the reference says so too.
        expect_close(out, ref.out, rowwise_tolerance<T>(),
                     std::string("extreme rows ") + dtype_name(x.view().dtype) +
                         (fused ? " fused" : "") + " eps " + std::to_string(eps) + " threads " +
                         std::to_string(threads) + " isa " + active_isa_name());
      }
    }
  }
  set_num_threads(0);
}

TEST(NormRange, RowsNearTheEndsOfFp32AreNormalizedExactly) {
  check_extreme_rows<float>();
  check_extreme_rows<bf16>();
}

// eps near FLT_MAX beside a mean square of 2^110 (below the 2^126 that sends a row to the fp64
// path): their fp32 sum overflowed, so the output was 0 instead of x / sqrt(2^110 + eps).
TEST(NormRange, EpsNearFltMaxBesideALargeMeanSquare) {
  for (const bool fused : {false, true}) {
    TestTensor<float> x({2, 4}), residual({2, 4}), out({2, 4}), sum({2, 4});
    for (std::int64_t i = 0; i < x.size(); ++i) x.at(i) = (i % 3 ? 1.f : -1.f) * 0x1p55f;
    const float eps = std::numeric_limits<float>::max();
    const NormReference ref = norm_reference(x, fused ? &residual : nullptr, {}, eps);
    if (fused) {
      add_rms_norm(x.view(), residual.view(), {}, eps, out.view(), sum.view());
    } else {
      rms_norm(x.view(), {}, eps, out.view());
    }
    expect_close(
        out, ref.out, rowwise_tolerance<float>(),
        std::string("eps FLT_MAX") + (fused ? " fused" : "") + " isa " + active_isa_name());
  }
}

// ---- bad input -----------------------------------------------------------------------------

TEST(NormBadInput, EveryInvalidArgumentThrowsBeforeWriting) {
  TestTensor<float> x({4, 64}), residual({4, 64}), out({4, 64}), sum({4, 64}), weight({64});
  TestTensor<float> wrong_d({4, 65}), weight_short({63}), scalar_like({});
  TestTensor<bf16> x_bf16({4, 64});
  TestTensor<std::int32_t> x_int({4, 64});
  const TensorView w = weight.view();

  expect_rejected([&] { rms_norm(scalar_like.view(), w, 1e-6f, out.view()); }, "x has rank 0", out);
  expect_rejected([&] { rms_norm(x.view(), w, 1e-6f, wrong_d.view()); }, "out.shape[1] (65)", out);
  expect_rejected([&] { rms_norm(x.view(), weight_short.view(), 1e-6f, out.view()); },
                  "weight.shape[0] (63)", out);
  expect_rejected([&] { rms_norm(x_bf16.view(), w, 1e-6f, out.view()); }, "out.dtype", out);
  expect_rejected([&] { rms_norm(x_int.view(), w, 1e-6f, out.view()); }, "x.dtype is i32", out);
  expect_rejected([&] { rms_norm(x.view(), w, -1.f, out.view()); }, "eps", out);
  expect_rejected([&] { rms_norm(x.view(), w, NAN, out.view()); }, "eps", out);
  TensorView null_x = x.view();
  null_x.data = nullptr;
  expect_rejected([&] { rms_norm(null_x, w, 1e-6f, out.view()); }, "x.data is null", out);
  TensorView negative = x.view();
  negative.shape[0] = -4;
  expect_rejected([&] { rms_norm(negative, w, 1e-6f, out.view()); }, "x.shape[0] (-4)", out);
  TensorView huge = x.view();
  huge.shape[0] = std::int64_t{1} << 62;
  huge.strides[0] = 1 << 20;
  expect_rejected([&] { rms_norm(huge, w, 1e-6f, out.view()); }, "int64", out);
  TensorView non_contiguous = x.view();
  non_contiguous.shape[1] = 32;
  non_contiguous.strides[1] = 2;
  expect_rejected([&] { rms_norm(non_contiguous, {}, 1e-6f, out.view()); },
                  "x.strides[1] (2) must be 1", out);
  TensorView negative_stride = x.view();
  negative_stride.strides[0] = -64;
  expect_rejected([&] { rms_norm(negative_stride, w, 1e-6f, out.view()); }, "x.strides[0]", out);
  TensorView self_overlapping = out.view();
  self_overlapping.strides[0] = 32;
  expect_rejected([&] { rms_norm(x.view(), w, 1e-6f, self_overlapping); }, "write the same element",
                  out);
  TensorView shifted = out.view();  // overlaps x's storage without being x
  shifted.data = static_cast<float*>(x.view().data) + 1;
  shifted.shape[0] = 3;
  TensorView x3 = x.view();
  x3.shape[0] = 3;
  expect_rejected([&] { rms_norm(x3, w, 1e-6f, shifted); }, "out may overlap x", out);
  EXPECT_NO_THROW(rms_norm(x.view(), w, 1e-6f, x.view())) << "in place is allowed";
}

// Non-finite data is the caller's choice: it propagates to its own rows and never crashes, writes
// outside out, or spills into other rows (streaming and fused paths, bf16 too).
TEST(NormNonFinite, NanAndInfStayInTheirRows) {
  set_num_threads(2);
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (const std::int64_t dim : {64, 4101}) {
    TestTensor<float> x({4, dim}), residual({4, dim}), weight({dim}), out({4, dim}), sum({4, dim});
    std::mt19937 rng(92);
    x.fill_normal(rng);
    residual.fill_normal(rng);
    weight.fill_normal(rng);
    x.at(0) = kNan;
    x.at(dim + 3) = kInf;
    residual.at(2 * dim + 1) = -kInf;
    weight.at(5) = kInf;  // every row: inf (or nan) in column 5 only
    rms_norm(x.view(), weight.view(), 1e-6f, out.view());
    add_rms_norm(x.view(), residual.view(), weight.view(), 1e-6f, out.view(), sum.view());
    EXPECT_EQ(out.damaged_canaries(), 0);
    EXPECT_EQ(sum.damaged_canaries(), 0);
    for (std::int64_t column = 0; column < dim; ++column) {
      if (column == 5) continue;
      EXPECT_TRUE(std::isfinite(out.value(3 * dim + column))) << column;
    }
    EXPECT_TRUE(std::isnan(out.value(1)));
    TestTensor<bf16> x16({2, dim}), out16({2, dim});
    x16.at(1) = bf16::from_float(kNan);
    rms_norm(x16.view(), {}, 1e-6f, out16.view());
    EXPECT_EQ(out16.damaged_canaries(), 0);
    EXPECT_TRUE(std::isfinite(out16.value(dim + 1)));
  }
}

// bf16 outputs of finite rows skip the NaN case of the rounding unless the weight has a NaN or
// an infinity. A NaN weight whose payload fills the upper mantissa (0x7fff8000) carries into
// the sign when rounded without that case (it would read -0, 0xffff8000 +0), and one with only
// low payload bits (0x7f800001) would read inf: both must stay NaN in their column.
TEST(NormNonFinite, NanWeightsStayNanInBf16Outputs) {
  for (const int threads : {1, 2}) {
    set_num_threads(threads);
    for (const std::int64_t dim : {64, 128, 3072}) {
      TestTensor<bf16> x({8, dim}), residual({8, dim}), out({8, dim}), sum({8, dim});
      TestTensor<float> weight({dim});
      std::mt19937 rng(93);
      x.fill_normal(rng);
      residual.fill_normal(rng);
      weight.fill_normal(rng);
      const std::int64_t columns[] = {3, 17, dim - 1};
      const std::uint32_t payloads[] = {0x7fff8000u, 0xffff8000u, 0x7f800001u};
      for (int i = 0; i < 3; ++i) weight.at(columns[i]) = std::bit_cast<float>(payloads[i]);
      for (const bool fused : {false, true}) {
        if (fused) {
          add_rms_norm(x.view(), residual.view(), weight.view(), 1e-6f, out.view(), sum.view());
        } else {
          rms_norm(x.view(), weight.view(), 1e-6f, out.view());
        }
        EXPECT_EQ(out.damaged_canaries(), 0);
        for (std::int64_t row = 0; row < 8; ++row) {
          for (const std::int64_t column : columns) {
            EXPECT_TRUE(std::isnan(out.value(row * dim + column)))
                << "row " << row << " column " << column << " dim " << dim << " fused " << fused;
          }
          EXPECT_TRUE(std::isfinite(out.value(row * dim + 5)));
        }
      }
    }
  }
}

// Strides near INT64_MAX: the view's extent (last element + 1) must be computed with overflow
// checks (it was signed overflow, undefined behaviour), and rejected.
TEST(NormBadInput, ExtentsThatOverflowInt64AreRejected) {
  TestTensor<float> x({2, 64}), out({2, 64});
  for (const std::int64_t stride : {INT64_MAX, INT64_MAX / 2 + 1, INT64_MAX / 4 + 1}) {
    TensorView far = x.view();
    far.shape[1] = 1;
    far.strides[0] = stride;
    expect_rejected([&] { rms_norm(far, {}, 1e-6f, out.view()); },
                    "spans more bytes than int64 can address", out);
  }
}

// Messages: a dtype listed twice is named once; views judged by address range "may" overlap.
TEST(NormBadInput, MessagesSayWhatWasChecked) {
  TestTensor<float> x({2, 64}), out({2, 64});
  TestTensor<bf16> weight({64});
  expect_rejected([&] { rms_norm(x.view(), weight.view(), 1e-6f, out.view()); },
                  "weight.dtype is bf16, expected f32", out);
  // Rows of x and out interleaved in one buffer: no shared element, intersecting ranges.
  TestTensor<float> both({4, 64});
  TensorView even = both.view(), odd = both.view();
  even.shape[0] = odd.shape[0] = 2;
  even.strides[0] = odd.strides[0] = 128;
  odd.data = static_cast<float*>(odd.data) + 64;
  expect_rejected([&] { rms_norm(even, {}, 1e-6f, odd); },
                  "out may overlap x (their address ranges intersect", both);
}

TEST(NormBadInput, FusedAliasingRules) {
  TestTensor<float> x({4, 64}), residual({4, 64}), out({4, 64}), sum({4, 64}), weight({64});
  const TensorView w = weight.view();
  expect_rejected(
      [&] { add_rms_norm(x.view(), residual.view(), w, 1e-6f, out.view(), out.view()); },
      "out may overlap sum_out", out);
  expect_rejected(
      [&] { add_rms_norm(x.view(), residual.view(), w, 1e-6f, weight.view(), sum.view()); },
      "out has shape [64]", out);
  TestTensor<float> residual_short({3, 64});
  expect_rejected(
      [&] { add_rms_norm(x.view(), residual_short.view(), w, 1e-6f, out.view(), sum.view()); },
      "residual.shape[0] (3)", out);
  TensorView w_alias = out.view();  // weight living inside out's memory
  w_alias.rank = 1;
  w_alias.shape[0] = 64;
  w_alias.strides[0] = 1;
  expect_rejected(
      [&] { add_rms_norm(x.view(), residual.view(), w_alias, 1e-6f, out.view(), sum.view()); },
      "out may overlap weight", out);
}

}  // namespace
}  // namespace ditops::test

namespace ditops::test {
namespace {

// Outputs above 32 MiB are written with streaming stores after an unaligned head; rows start
// at every misalignment here (row lengths 4101 and 101, odd: long rows one per pass, short rows
// four per pass with a tail row), and the fused form streams sum_out too.
TYPED_TEST(NormTest, LargeOutputsUseStreamingStoresCorrectly) {
  std::mt19937 rng(77);
  for (const std::int64_t dim : {4101, 101}) {
    const std::int64_t rows = (std::int64_t{33} << 20) / (dim * sizeof(TypeParam)) / 4 * 4 + 5;
    for (bool fused : {false, true}) {
      NormCase<TypeParam>{{rows, dim}, 0, WeightKind::f32, 2, fused, false}.run_and_check(rng);
    }
  }
}

// Buffers as users allocate them: every tensor starting at every offset within a cache line
// (16 bytes past one is where malloc and numpy put large arrays). Outputs above 32 MiB are
// streamed; rows of 136 elements share lines with their neighbours whatever the offset, rows of
// 3072 do from any offset but 0. The bits of out (and sum_out) must be those of the
// line-aligned run, 2 threads splitting the rows, with nothing written outside them.
template <class T>
void expect_every_line_offset_equal(std::int64_t dim, bool fused) {
  set_num_threads(2);
  const std::int64_t rows = (std::int64_t{33} << 20) / (dim * sizeof(T)) + 3;
  const auto count = static_cast<std::size_t>(rows * dim);
  std::vector<T> x0(count), residual0(count);
  std::vector<float> weight(static_cast<std::size_t>(dim));
  std::mt19937 rng(14);
  std::normal_distribution<float> normal;
  for (T& value : x0) value = from_float<T>(normal(rng));
  for (T& value : residual0) value = from_float<T>(normal(rng));
  for (float& value : weight) value = 1.f + 0.1f * normal(rng);
  OffsetBuffer<T> x(count), residual(count), out(count), sum_out(count);
  std::vector<T> aligned_out(count), aligned_sum(count);
  const auto run = [&](std::size_t offset) {
    T* xs = x.place(offset);
    T* rs = residual.place(offset);
    std::memcpy(xs, x0.data(), x.bytes());
    std::memcpy(rs, residual0.data(), residual.bytes());
    T* o = out.place(offset);
    T* so = sum_out.place(offset);
    if (fused) {
      add_rms_norm(view(xs, {rows, dim}), view(rs, {rows, dim}), view(weight.data(), {dim}), 1e-6f,
                   view(o, {rows, dim}), view(so, {rows, dim}));
    } else {
      rms_norm(view(xs, {rows, dim}), view(weight.data(), {dim}), 1e-6f, view(o, {rows, dim}));
    }
    EXPECT_TRUE(out.guards_intact() && sum_out.guards_intact()) << "offset " << offset;
    return std::pair<const T*, const T*>{o, so};
  };
  const auto [o0, so0] = run(0);
  std::memcpy(aligned_out.data(), o0, out.bytes());
  std::memcpy(aligned_sum.data(), so0, sum_out.bytes());
  for (std::size_t offset = sizeof(T); offset < kLineBytes; offset += sizeof(T)) {
    const auto [o, so] = run(offset);
    const std::string context = std::string(dtype_name(detail::dtype_of<T>())) + " D " +
                                std::to_string(dim) + (fused ? " add_rms_norm" : " rms_norm") +
                                ", tensors " + std::to_string(offset) + " bytes past a line, isa " +
                                active_isa_name();
    EXPECT_EQ(std::memcmp(o, aligned_out.data(), out.bytes()), 0) << context << ": out differs";
    if (fused) {
      EXPECT_EQ(std::memcmp(so, aligned_sum.data(), sum_out.bytes()), 0)
          << context << ": sum_out differs";
    }
  }
}

TEST(NormLineOffsets, LargeOutputsAtEveryOffsetEqualTheAlignedRun) {
  for (const bool fused : {false, true}) {
    expect_every_line_offset_equal<float>(136, fused);
    expect_every_line_offset_equal<bf16>(136, fused);
    expect_every_line_offset_equal<f16>(136, fused);
    expect_every_line_offset_equal<float>(3072, fused);  // rows longer than the stager's
  }
}

}  // namespace
}  // namespace ditops::test
