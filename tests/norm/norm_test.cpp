// rms_norm, add_rms_norm, layer_norm and layer_norm_scale_shift against the fp64 references, on
// every dtype, over D sweeps with tails, strided rows, in place, every modulation form, 1 and 2
// threads, buffers at every offset in a cache line; and every class of bad input.

#include <bit>
#include <cmath>
#include <cstring>
#include <ditops/norm.hpp>
#include <ditops/runtime.hpp>
#include <iterator>
#include <limits>
#include <random>
#include <string>
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

// Outputs above the streaming threshold are written with streaming stores after an unaligned head;
// rows start at every misalignment here (row lengths 4101 and 101, odd: long rows one per pass,
// short rows four per pass with a tail row), and the fused form streams sum_out too.
TYPED_TEST(NormTest, LargeOutputsUseStreamingStoresCorrectly) {
  std::mt19937 rng(77);
  for (const std::int64_t dim : {4101, 101}) {
    const std::int64_t rows = streamed_output_bytes() / (dim * sizeof(TypeParam)) / 4 * 4 + 5;
    for (bool fused : {false, true}) {
      NormCase<TypeParam>{{rows, dim}, 0, WeightKind::f32, 2, fused, false}.run_and_check(rng);
    }
  }
}

// Buffers as users allocate them: every tensor starting at every offset within a cache line
// (16 bytes past one is where malloc and numpy put large arrays). Outputs above the
// streaming threshold are
// streamed; rows of 136 elements share lines with their neighbours whatever the offset, rows of
// 3072 do from any offset but 0. The bits of out (and sum_out) must be those of the
// line-aligned run, 2 threads splitting the rows, with nothing written outside them.
template <class T>
void expect_every_line_offset_equal(std::int64_t dim, bool fused) {
  set_num_threads(2);
  const std::int64_t rows = streamed_output_bytes() / (dim * sizeof(T)) + 3;
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

// Short f32 rows (D a multiple of 16 up to 256) whose x and out share their offset within a
// vector are walked in aligned vectors, rows meeting inside a vector (norm_kernel.cpp); their
// bits must be those of the line-aligned run on one thread: from every offset, on 1 and 2
// threads (ranges of odd row counts, split inside a line), with and without weight, streamed or
// not, in place, with x and out at different offsets (the other path), and with rows whose sum
// of squares overflows or is NaN (redone in double) at the ends of passes and of each thread's
// range.
void expect_short_rows_offsets_equal(std::int64_t rows, std::int64_t dim,
                                     const std::vector<std::size_t>& offsets) {
  const auto count = static_cast<std::size_t>(rows * dim);
  std::vector<float> x0(count), weight(static_cast<std::size_t>(dim));
  std::mt19937 rng(static_cast<unsigned>(rows * dim));
  std::normal_distribution<float> normal;
  for (float& value : x0) value = normal(rng);
  for (float& value : weight) value = 1.f + 0.1f * normal(rng);
  if (rows > 8) {
    const std::int64_t half = rows / 2;
    for (const std::int64_t row :
         {std::int64_t{0}, std::int64_t{3}, std::int64_t{4}, half - 1, half, rows - 1}) {
      for (std::int64_t i = 0; i < dim; ++i) x0[static_cast<std::size_t>(row * dim + i)] *= 1e25f;
    }
    x0[static_cast<std::size_t>(5 * dim + 7)] = std::numeric_limits<float>::quiet_NaN();
    x0[static_cast<std::size_t>((half + 1) * dim)] = std::numeric_limits<float>::infinity();
  }
  OffsetBuffer<float> x(count), out(count);
  const auto run = [&](std::size_t x_offset, std::size_t out_offset, bool in_place, bool weighted,
                       int threads) {
    set_num_threads(threads);
    float* xs = x.place_copy(x_offset, x0);
    float* o = in_place ? xs : out.place(out_offset);
    rms_norm(view(xs, {rows, dim}), weighted ? view(weight.data(), {dim}) : TensorView{}, kEps,
             view(o, {rows, dim}));
    EXPECT_TRUE(x.guards_intact() && (in_place || out.guards_intact()))
        << "x at " << x_offset << ", out at " << out_offset;
    return std::vector<float>(o, o + count);
  };
  for (const bool weighted : {true, false}) {
    const std::vector<float> aligned = run(0, 0, false, weighted, 1);
    for (const int threads : {1, 2}) {
      for (const std::size_t offset : offsets) {
        const std::string context = "D " + std::to_string(dim) + ", " + std::to_string(rows) +
                                    " rows, " + (weighted ? "weight" : "no weight") + ", " +
                                    std::to_string(threads) + " threads, isa " + active_isa_name() +
                                    ", x at " + std::to_string(offset);
        const auto same_bits = [&](const std::vector<float>& got) {
          return std::memcmp(got.data(), aligned.data(), count * sizeof(float)) == 0;
        };
        EXPECT_TRUE(same_bits(run(offset, offset, false, weighted, threads))) << context;
        EXPECT_TRUE(same_bits(run(offset, offset, true, weighted, threads)))
            << context << " in place";
        const std::size_t other = (offset + 20) % kLineBytes;
        EXPECT_TRUE(same_bits(run(offset, other, false, weighted, threads)))
            << context << ", out at " << other;
      }
    }
  }
  set_num_threads(0);
}

TEST(NormLineOffsets, ShortRowsAtEveryOffsetEqualTheAlignedRun) {
  std::vector<std::size_t> every;
  for (std::size_t offset = 4; offset < kLineBytes; offset += 4) every.push_back(offset);
  for (const std::int64_t dim : {16, 64, 128, 256}) {
    expect_short_rows_offsets_equal(3, dim, every);                          // less than a pass
    expect_short_rows_offsets_equal((1 << 20) / (dim * 4) + 3, dim, every);  // 2 threads
  }
  // Streamed (out above the threshold).
  expect_short_rows_offsets_equal(streamed_output_bytes() / (128 * 4) + 3, 128, {4, 16, 60});
  expect_short_rows_offsets_equal(streamed_output_bytes() / (64 * 4) + 1, 64, {16});
}

}  // namespace
}  // namespace ditops::test

// ---- layer_norm and layer_norm_scale_shift ------------------------------------------------

namespace ditops::test {
namespace {

// The fp32 error of LayerNorm beyond the rounding of its output, relative to the magnitude of
// the terms the kernel rounds (LayerNormReference::magnitude): the fp32 sums of D values and of
// D squared deviations in 2-vector partial sums (relative error at most D / (2 lanes) 2^-24,
// ~sqrt(D / (2 lanes)) 2^-24 in practice: 1.5e-6 at D = 5120 with SSE's 4 lanes), then a few
// roundings (rsqrt, the products, 1 + scale). 2e-5 is the RMSNorm bound on the same sums.
constexpr double kLayerNormTermError = 2e-5;

/// |got - ref| <= atol + rtol |ref| + kLayerNormTermError magnitude per element (the output
/// dtype's tolerance plus the fp32 error of the terms: a result that cancels to near zero is
/// judged by the size of what cancelled), and nothing written outside `got`.
template <class T>
void expect_layer_norm_close(const TestTensor<T>& got, const LayerNormReference& ref,
                             const std::string& context) {
  ASSERT_EQ(static_cast<std::size_t>(got.size()), ref.out.size()) << context;
  const Tolerance tol = rowwise_tolerance<T>();
  std::int64_t failures = 0, worst = -1;
  double worst_excess = 0;
  for (std::int64_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got.value(i) - ref.out[i]);
    const double bound =
        tol.atol + tol.rtol * std::fabs(ref.out[i]) + kLayerNormTermError * ref.magnitude[i];
    if (!(err <= bound) && (worst < 0 || !(err - bound <= worst_excess))) {
      worst = i;
      worst_excess = err - bound;
    }
    failures += !(err <= bound);  // NaN fails too
  }
  EXPECT_EQ(failures, 0) << context << ": " << failures << " of " << got.size()
                         << " elements out of tolerance; worst element " << worst << " got "
                         << (worst >= 0 ? got.value(worst) : 0) << " expected "
                         << (worst >= 0 ? ref.out[worst] : 0);
  EXPECT_EQ(got.damaged_canaries(), 0) << context << ": wrote outside its elements";
}

// The widths the brief of this operator names: odd tails for every vector width (1, 3, 17,
// 127), one whole AVX-512 pair (64), DiT hidden sizes (3072: FLUX, 5120: Wan 14B).
const std::int64_t kLayerNormDims[] = {1, 3, 17, 64, 127, 3072, 5120};
// [B, S] around the 4-row passes of short rows: a lone row, fewer than a pass, a pass and a
// 2-row tail, three passes and a 3-row tail across batch elements.
const std::pair<std::int64_t, std::int64_t> kBatchSeq[] = {{1, 1}, {1, 3}, {2, 3}, {3, 5}};

enum class Affine { none, weight_only, f32, same_dtype };
/// scale and shift: none, [B, 1, D] (MindIE-SD's [B, D] and [B, 1, D]) or [B, S, D], in the
/// dtype of x or f32; mixed: scale [B, 1, D] beside shift [B, S, D].
enum class Modulation { none, per_batch, per_batch_f32, per_token, per_token_f32, mixed };
const Affine kAffines[] = {Affine::none, Affine::weight_only, Affine::f32, Affine::same_dtype};
const Modulation kModulations[] = {Modulation::none,          Modulation::per_batch,
                                   Modulation::per_batch_f32, Modulation::per_token,
                                   Modulation::per_token_f32, Modulation::mixed};

/// The values of a [B, 1 | S, D] tensor broadcast to each element of x [B, S, D].
template <class T>
std::vector<double> broadcast_values(const TestTensor<T>& m, std::int64_t batch, std::int64_t seq,
                                     std::int64_t dim) {
  const std::int64_t m_seq = m.shape()[1];
  std::vector<double> values;
  values.reserve(static_cast<std::size_t>(batch * seq * dim));
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t s = 0; s < seq; ++s) {
      for (std::int64_t i = 0; i < dim; ++i) {
        values.push_back(m.value((b * m_seq + (m_seq == 1 ? 0 : s)) * dim + i));
      }
    }
  }
  return values;
}

/// Per-channel vectors and modulation tensors of one case, in f32 and in T with equal values.
template <class T>
struct LayerNormOperands {
  TestTensor<float> weight_f32, bias_f32, scale_f32, shift_f32;
  TestTensor<T> weight_same, bias_same, scale_same, shift_same;

  LayerNormOperands(std::mt19937& rng, std::int64_t batch, std::int64_t scale_seq,
                    std::int64_t shift_seq, std::int64_t dim)
      : weight_f32({dim}),
        bias_f32({dim}),
        scale_f32({batch, scale_seq, dim}),
        shift_f32({batch, shift_seq, dim}),
        weight_same({dim}),
        bias_same({dim}),
        scale_same({batch, scale_seq, dim}),
        shift_same({batch, shift_seq, dim}) {
    fill(rng, weight_f32, weight_same, 1.f, 0.5f);
    fill(rng, bias_f32, bias_same, 0.f, 0.5f);
    fill(rng, scale_f32, scale_same, 0.f, 0.5f);
    fill(rng, shift_f32, shift_same, 0.f, 0.5f);
  }

 private:
  static void fill(std::mt19937& rng, TestTensor<float>& wide, TestTensor<T>& narrow, float mean,
                   float stddev) {
    std::normal_distribution<float> normal(mean, stddev);
    for (std::int64_t i = 0; i < wide.size(); ++i) {
      narrow.at(i) = from_float<T>(normal(rng));
      wide.at(i) = to_float(narrow.at(i));
    }
  }
};

template <class T>
struct LayerNormCase {
  std::int64_t batch, seq, dim, pad;
  Affine affine;
  Modulation modulation;
  bool in_place;
  int threads = 1;

  std::string describe() const {
    return std::string(modulation == Modulation::none ? "layer_norm " : "layer_norm_scale_shift ") +
           dtype_name(detail::dtype_of<T>()) + " [" + std::to_string(batch) + "," +
           std::to_string(seq) + "," + std::to_string(dim) + "] pad " + std::to_string(pad) +
           " affine " + std::to_string(static_cast<int>(affine)) + " modulation " +
           std::to_string(static_cast<int>(modulation)) + (in_place ? " in-place" : "") +
           " threads " + std::to_string(threads) + " isa " + active_isa_name();
  }

  void run_and_check(std::mt19937& rng) const {
    set_num_threads(threads);
    const bool per_token =
        modulation == Modulation::per_token || modulation == Modulation::per_token_f32;
    const bool f32_modulation =
        modulation == Modulation::per_batch_f32 || modulation == Modulation::per_token_f32;
    const std::vector<std::int64_t> shape{batch, seq, dim};
    TestTensor<T> x(shape, pad), out(shape, pad);
    x.fill_normal(rng, 0.3f, 1.5f);
    LayerNormOperands<T> operands(rng, batch, per_token ? seq : 1,
                                  per_token || modulation == Modulation::mixed ? seq : 1, dim);
    std::vector<double> weight, bias, scale, shift;
    TensorView weight_view{}, bias_view{}, scale_view{}, shift_view{};
    const auto take = [&](auto& tensor, std::vector<double>& values, TensorView& view) {
      for (std::int64_t i = 0; i < tensor.size(); ++i) values.push_back(tensor.value(i));
      view = tensor.view();
    };
    if (affine == Affine::same_dtype) {
      take(operands.weight_same, weight, weight_view);
      take(operands.bias_same, bias, bias_view);
    } else if (affine != Affine::none) {
      take(operands.weight_f32, weight, weight_view);
      if (affine == Affine::f32) take(operands.bias_f32, bias, bias_view);
    }
    if (modulation != Modulation::none) {
      const auto& scale_tensor = operands.scale_same;
      const auto& shift_tensor = operands.shift_same;
      scale = broadcast_values(scale_tensor, batch, seq, dim);
      shift = broadcast_values(shift_tensor, batch, seq, dim);
      scale_view = f32_modulation ? operands.scale_f32.view() : operands.scale_same.view();
      shift_view = f32_modulation ? operands.shift_f32.view() : operands.shift_same.view();
    }
    const LayerNormReference ref = layer_norm_reference(x, weight, bias, scale, shift, kEps);
    TestTensor<T>& target = in_place ? x : out;
    if (modulation == Modulation::none) {
      layer_norm(x.view(), weight_view, bias_view, kEps, target.view());
    } else {
      layer_norm_scale_shift(x.view(), weight_view, bias_view, scale_view, shift_view, kEps,
                             target.view());
    }
    expect_layer_norm_close(target, ref, describe());
  }
};

TYPED_TEST(NormTest, LayerNormMatchesReferenceOverSweep) {
  std::mt19937 rng(4321);
  for (const std::int64_t dim : kLayerNormDims) {
    for (const auto& [batch, seq] : kBatchSeq) {
      for (const std::int64_t pad : {0, 5}) {
        for (std::size_t a = 0; a < std::size(kAffines); ++a) {
          for (std::size_t m = 0; m < std::size(kModulations); ++m) {
            // Long rows (one per pass, the same code for every tail) meet each modulation with
            // one affine form, in turn: a quarter of the time.
            if (dim >= 3072 && a != (m + pad) % std::size(kAffines)) continue;
            // Padded rows run in place: strided and in-place both meet every other option.
            LayerNormCase<TypeParam>{batch, seq, dim, pad, kAffines[a], kModulations[m], pad != 0}
                .run_and_check(rng);
          }
        }
      }
    }
  }
}

// Shapes whose rows the split really gives two threads (> 512 KiB streamed), split inside a
// batch element (3 x 45 rows): each thread folds its own copy of a broadcast modulation.
TYPED_TEST(NormTest, LayerNormTwoThreadsMatchReferenceAndOneThreadBitwise) {
  std::mt19937 rng(98);
  for (const Modulation modulation :
       {Modulation::none, Modulation::per_batch, Modulation::per_token}) {
    LayerNormCase<TypeParam> two{3, 45, 3072, 3, Affine::f32, modulation, false, 2};
    two.run_and_check(rng);
    const std::vector<std::int64_t> shape{3, 45, 3072};
    const std::int64_t modulated_seq = modulation == Modulation::per_token ? 45 : 1;
    TestTensor<TypeParam> x(shape), scale({3, modulated_seq, 3072}),
        shift({3, modulated_seq, 3072}), out1(shape), out2(shape);
    x.fill_normal(rng);
    scale.fill_normal(rng, 0.f, 0.5f);
    shift.fill_normal(rng);
    for (const int threads : {1, 2}) {
      set_num_threads(threads);
      TestTensor<TypeParam>& out = threads == 1 ? out1 : out2;
      if (modulation == Modulation::none) {
        layer_norm(x.view(), {}, {}, kEps, out.view());
      } else {
        layer_norm_scale_shift(x.view(), {}, {}, scale.view(), shift.view(), kEps, out.view());
      }
    }
    // Rows are independent, so the thread count must not change a single bit.
    EXPECT_TRUE(out2.unchanged_since(out1.snapshot())) << "thread count changed the result";
  }
  set_num_threads(0);
}

// scale = shift = 0 leaves layer_norm's bits: the broadcast fold gives weight * 1 and
// bias * 1 + 0 exactly, the per-token form fma(y, 1, 0) = y.
TYPED_TEST(NormTest, ZeroModulationIsLayerNormBitForBit) {
  std::mt19937 rng(12);
  for (const std::int64_t dim : {17, 3072}) {
    TestTensor<TypeParam> x({2, 6, dim}), plain({2, 6, dim}), modulated({2, 6, dim});
    TestTensor<float> weight({dim}), bias({dim});
    x.fill_normal(rng);
    weight.fill_normal(rng, 1.f, 0.5f);
    bias.fill_normal(rng);
    layer_norm(x.view(), weight.view(), bias.view(), kEps, plain.view());
    for (const std::int64_t modulated_seq : {1, 6}) {
      TestTensor<TypeParam> zeros({2, modulated_seq, dim});
      layer_norm_scale_shift(x.view(), weight.view(), bias.view(), zeros.view(), zeros.view(), kEps,
                             modulated.view());
      EXPECT_TRUE(modulated.unchanged_since(plain.snapshot()))
          << "D " << dim << " scale rows " << modulated_seq << " isa " << active_isa_name();
    }
  }
}

// Rows whose mean is large beside their spread (x = 1000 + N(0, 1)): the variance is the mean
// of squared deviations, not E[x^2] - mean^2, which cancels (it loses 1000^2 / 1 = 2^20 of the
// 2^24 of fp32's precision: errors of ~1e-1 in the output). The fp32 sum of 3072 values near
// 1000 gives the mean within ~1e-4, hence outputs within ~1e-4 of the fp64 reference: 1e-3.
TEST(LayerNormRange, LargeMeanIsNotCancelled) {
  std::mt19937 rng(21);
  TestTensor<float> x({4, 3072}), out({4, 3072});
  x.fill_normal(rng, 1000.f, 1.f);
  layer_norm(x.view(), {}, {}, kEps, out.view());
  const LayerNormReference ref = layer_norm_reference(x, {}, {}, {}, {}, kEps);
  for (std::int64_t i = 0; i < x.size(); ++i) {
    ASSERT_NEAR(out.value(i), ref.out[i], 1e-3) << "element " << i << " isa " << active_isa_name();
  }
}

// Rows near the ends of fp32 take the double path: squared deviations that overflow (|x| ~
// 2^70, 2^124), a sum that overflows (x ~ 2^124 * 4 over 37 elements), squares that underflow
// with eps = 0 (|x| ~ 2^-70, 2^-120). Each is still normalized within the usual tolerance,
// plain and with a broadcast modulation, beside a row of ordinary values, 1 and 2 threads.
template <class T>
void check_layer_norm_extreme_rows() {
  std::mt19937 rng(72);
  const float magnitude[5] = {0x1p70f, 0x1p-70f, 1.f, 0x1p124f, 0x1p-120f};
  for (const bool modulated : {false, true}) {
    for (const float eps : {0.f, 1e-6f}) {
      for (const int threads : {1, 2}) {
        set_num_threads(threads);
        TestTensor<T> x({1, 5, 37}), out({1, 5, 37});
        TestTensor<float> scale({1, 1, 37}), shift({1, 1, 37});
        x.fill_normal(rng, 4.f, 1.f);
        scale.fill_normal(rng, 0.f, 0.5f);
        shift.fill_normal(rng);
        for (std::int64_t i = 0; i < x.size(); ++i) {
          x.at(i) = from_float<T>(to_float(x.at(i)) * magnitude[i / 37]);
        }
        std::vector<double> scale_values, shift_values;
        if (modulated) {
          scale_values = broadcast_values(scale, 1, 5, 37);
          shift_values = broadcast_values(shift, 1, 5, 37);
          layer_norm_scale_shift(x.view(), {}, {}, scale.view(), shift.view(), eps, out.view());
        } else {
          layer_norm(x.view(), {}, {}, eps, out.view());
        }
        const LayerNormReference ref =
            layer_norm_reference(x, {}, {}, scale_values, shift_values, eps);
        expect_layer_norm_close(out, ref,
                                std::string("extreme rows ") + dtype_name(x.view().dtype) +
                                    (modulated ? " modulated" : "") + " eps " +
                                    std::to_string(eps) + " threads " + std::to_string(threads) +
                                    " isa " + active_isa_name());
      }
    }
  }
  set_num_threads(0);
}

TEST(LayerNormRange, RowsNearTheEndsOfFp32AreNormalizedExactly) {
  check_layer_norm_extreme_rows<float>();
  check_layer_norm_extreme_rows<bf16>();
}

// NaN and infinity stay in their rows (and columns): x's in rows 0 and 1, a per-token scale's
// in row 2, column 3; an infinite weight in column 5 of every row. Short and long rows.
TEST(LayerNormNonFinite, NanAndInfStayInTheirRows) {
  set_num_threads(2);
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (const std::int64_t dim : {64, 4101}) {
    TestTensor<float> x({1, 4, dim}), scale({1, 4, dim}), shift({1, 4, dim}), weight({dim}),
        out({1, 4, dim});
    std::mt19937 rng(94);
    x.fill_normal(rng);
    scale.fill_normal(rng, 0.f, 0.5f);
    shift.fill_normal(rng);
    weight.fill_normal(rng, 1.f, 0.5f);
    x.at(7) = kNan;
    x.at(dim + 3) = kInf;
    scale.at(2 * dim + 3) = kNan;
    weight.at(5) = kInf;
    layer_norm_scale_shift(x.view(), weight.view(), {}, scale.view(), shift.view(), 1e-6f,
                           out.view());
    EXPECT_EQ(out.damaged_canaries(), 0);
    EXPECT_TRUE(std::isnan(out.value(1))) << "a NaN in x makes its row NaN";
    EXPECT_TRUE(std::isnan(out.value(2 * dim + 3)));
    for (std::int64_t column = 0; column < dim; ++column) {
      if (column == 5) continue;
      EXPECT_TRUE(std::isfinite(out.value(3 * dim + column))) << column;
      if (column != 3) {
        EXPECT_TRUE(std::isfinite(out.value(2 * dim + column))) << column;
      }
    }
    layer_norm(x.view(), weight.view(), {}, 1e-6f, out.view());
    EXPECT_EQ(out.damaged_canaries(), 0);
    EXPECT_TRUE(std::isfinite(out.value(3 * dim + 4)));
  }
  set_num_threads(0);
}

// bf16 outputs of finite rows skip the NaN case of the rounding only when the weight and bias
// (or their fold with a broadcast scale and shift) are finite: NaN payloads that would round
// to -0 or inf without it (see NormNonFinite.NanWeightsStayNanInBf16Outputs) must stay NaN,
// whether they come from the weight or from the scale.
TEST(LayerNormNonFinite, NanWeightsAndScalesStayNanInBf16Outputs) {
  const std::uint32_t payloads[] = {0x7fff8000u, 0xffff8000u, 0x7f800001u};
  for (const std::int64_t dim : {64, 3072}) {
    const std::int64_t columns[] = {3, 17, dim - 1};
    for (const bool from_scale : {false, true}) {
      TestTensor<bf16> x({2, 4, dim}), out({2, 4, dim});
      TestTensor<float> weight({dim}), scale({2, 1, dim}), shift({2, 1, dim});
      std::mt19937 rng(95);
      x.fill_normal(rng);
      weight.fill_normal(rng, 1.f, 0.5f);
      scale.fill_normal(rng, 0.f, 0.5f);
      shift.fill_normal(rng);
      for (int i = 0; i < 3; ++i) {
        const float nan = std::bit_cast<float>(payloads[i]);
        if (from_scale) {
          scale.at(dim + columns[i]) = nan;  // batch element 1 only
        } else {
          weight.at(columns[i]) = nan;
        }
      }
      if (from_scale) {
        layer_norm_scale_shift(x.view(), weight.view(), {}, scale.view(), shift.view(), 1e-6f,
                               out.view());
      } else {
        layer_norm(x.view(), weight.view(), {}, 1e-6f, out.view());
      }
      EXPECT_EQ(out.damaged_canaries(), 0);
      for (std::int64_t row = 0; row < 8; ++row) {
        const bool has_nan = !from_scale || row >= 4;
        for (const std::int64_t column : columns) {
          EXPECT_EQ(std::isnan(out.value(row * dim + column)), has_nan)
              << "row " << row << " column " << column << " dim " << dim << " from scale "
              << from_scale;
        }
        EXPECT_TRUE(std::isfinite(out.value(row * dim + 5)));
      }
    }
  }
}

TEST(LayerNormBadInput, EveryInvalidArgumentThrowsBeforeWriting) {
  TestTensor<float> x({2, 3, 64}), out({2, 3, 64}), weight({64}), bias({64}), scale({2, 1, 64}),
      shift({2, 3, 64});
  TestTensor<float> bias_short({63}), scale_rank2({2, 64}), scale_seq2({2, 2, 64}),
      scale_wide({2, 1, 65}), scale_batch3({3, 1, 64});
  TestTensor<bf16> x_bf16({2, 3, 64}), bias_bf16({64}), scale_bf16({2, 1, 64});
  TestTensor<std::int32_t> x_int({2, 3, 64});
  const TensorView w = weight.view(), b = bias.view(), sc = scale.view(), sh = shift.view();

  expect_rejected([&] { layer_norm(x.view(), w, bias_short.view(), 1e-5f, out.view()); },
                  "layer_norm: bias.shape[0] (63) must equal x.shape[2] (64)", out);
  expect_rejected([&] { layer_norm(x.view(), w, bias_bf16.view(), 1e-5f, out.view()); },
                  "layer_norm: bias.dtype is bf16, expected f32", out);
  expect_rejected([&] { layer_norm(x_int.view(), w, b, 1e-5f, out.view()); }, "x.dtype is i32",
                  out);
  expect_rejected([&] { layer_norm(x_bf16.view(), {}, {}, 1e-5f, out.view()); }, "out.dtype", out);
  expect_rejected([&] { layer_norm(x.view(), w, b, -1.f, out.view()); }, "layer_norm: eps", out);
  expect_rejected([&] { layer_norm(x.view(), w, b, INFINITY, out.view()); }, "eps", out);

  const auto scale_shift = [&](const TensorView& scale_view, const TensorView& shift_view) {
    layer_norm_scale_shift(x.view(), w, b, scale_view, shift_view, 1e-5f, out.view());
  };
  expect_rejected([&] { scale_shift(sc, {}); },
                  "layer_norm_scale_shift: shift is empty but scale is not", out);
  expect_rejected([&] { scale_shift({}, sh); }, "scale is empty but shift is not", out);
  expect_rejected([&] { scale_shift(scale_rank2.view(), sh); }, "scale has rank 2, expected 3",
                  out);
  expect_rejected([&] { scale_shift(sc, scale_seq2.view()); },
                  "shift.shape[1] (2) must be 1 or equal x.shape[1] (3)", out);
  expect_rejected([&] { scale_shift(scale_batch3.view(), sh); },
                  "scale.shape[0] (3) must be 1 or equal x.shape[0] (2)", out);
  expect_rejected([&] { scale_shift(scale_wide.view(), sh); },
                  "scale.shape[2] (65) must equal x.shape[2] (64)", out);
  expect_rejected([&] { scale_shift(scale_bf16.view(), sh); }, "scale.dtype is bf16, expected f32",
                  out);
  TestTensor<bf16> out_bf16({2, 3, 64});
  expect_rejected(
      [&] {
        layer_norm_scale_shift(x_bf16.view(), {}, {}, scale_bf16.view(), sh, 1e-5f,
                               out_bf16.view());
      },
      "shift.dtype (f32) must equal scale.dtype (bf16)", out_bf16);
  TensorView scale_in_out = out.view();  // a [2, 1, 64] scale inside out's memory
  scale_in_out.shape[1] = 1;
  expect_rejected([&] { scale_shift(scale_in_out, sh); }, "out may overlap scale", out);
  TensorView bias_in_out = out.view();
  bias_in_out.rank = 1;
  bias_in_out.shape[0] = 64;
  bias_in_out.strides[0] = 1;
  expect_rejected([&] { layer_norm(x.view(), w, bias_in_out, 1e-5f, out.view()); },
                  "out may overlap bias", out);
  EXPECT_NO_THROW(scale_shift(sc, sh));
  EXPECT_NO_THROW(layer_norm_scale_shift(x.view(), w, b, sc, sh, 1e-5f, x.view()))
      << "in place is allowed";
}

// Buffers as users allocate them: x, scale, shift and out starting at every offset within a
// cache line must give the bits of the line-aligned run, writing nothing outside out. Outputs
// above the streaming threshold are streamed: rows of 136 share lines with their neighbours
// (staged), rows of 3072 do from any offset but 0; per-token scale and shift are streamed in beside
// x.
template <class T>
void expect_layer_norm_offsets_equal(std::int64_t batch, std::int64_t seq, std::int64_t dim,
                                     bool per_token) {
  set_num_threads(2);
  const auto count = static_cast<std::size_t>(batch * seq * dim);
  const std::int64_t modulated_seq = per_token ? seq : 1;
  const auto modulation_count = static_cast<std::size_t>(batch * modulated_seq * dim);
  const std::vector<T> x0 = normal_values<T>(count, 15),
                       scale0 = normal_values<T>(modulation_count, 16),
                       shift0 = normal_values<T>(modulation_count, 17);
  const std::vector<float> weight = normal_values<float>(static_cast<std::size_t>(dim), 18),
                           bias = normal_values<float>(static_cast<std::size_t>(dim), 19);
  OffsetBuffer<T> x(count), out(count), scale(modulation_count), shift(modulation_count);
  const auto run = [&](std::size_t offset) {
    T* placed_out = out.place(offset);
    layer_norm_scale_shift(view(x.place_copy(offset, x0), {batch, seq, dim}),
                           view(weight.data(), {dim}), view(bias.data(), {dim}),
                           view(scale.place_copy(offset, scale0), {batch, modulated_seq, dim}),
                           view(shift.place_copy(offset, shift0), {batch, modulated_seq, dim}),
                           1e-6f, view(placed_out, {batch, seq, dim}));
    EXPECT_TRUE(out.guards_intact()) << "offset " << offset;
    return bytes_of(placed_out, count);
  };
  expect_every_offset_equals_aligned(
      sizeof(T), run,
      std::string("layer_norm_scale_shift ") + dtype_name(detail::dtype_of<T>()) + " [" +
          std::to_string(batch) + ", " + std::to_string(seq) + ", " + std::to_string(dim) + "]" +
          (per_token ? " per token" : " per batch"));
  set_num_threads(0);
}

TEST(LayerNormLineOffsets, EveryOffsetEqualsTheAlignedRun) {
  for (const bool per_token : {false, true}) {
    expect_layer_norm_offsets_equal<float>(2, 5, 136, per_token);
    expect_layer_norm_offsets_equal<bf16>(2, 5, 136, per_token);
    expect_layer_norm_offsets_equal<f16>(2, 5, 127, per_token);
  }
}

TEST(LayerNormLineOffsets, LargeOutputsAtEveryOffsetEqualTheAlignedRun) {
  const std::int64_t kStreamedBytes = streamed_output_bytes();
  expect_layer_norm_offsets_equal<float>(2, kStreamedBytes / (2 * 136 * 4) + 3, 136, true);
  expect_layer_norm_offsets_equal<float>(2, kStreamedBytes / (2 * 3072 * 4) + 3, 3072, false);
  expect_layer_norm_offsets_equal<bf16>(2, kStreamedBytes / (2 * 136 * 2) + 3, 136, false);
}

}  // namespace
}  // namespace ditops::test
