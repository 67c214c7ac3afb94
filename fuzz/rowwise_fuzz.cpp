// rms_norm, add_rms_norm and rotary_position_embedding over their argument space: dtypes
// (weight and tables in f32 or the input's dtype), ranks, strided rows, in-place and aliasing
// outputs, eps, broadcast tables, both RoPE modes and layouts, rows of any magnitude, invalid
// enums and broken views. Accepted calls are checked against the fp64 references.

#include <ditops/norm.hpp>
#include <ditops/rope.hpp>

#include "fuzz/support.hpp"
#include "tests/reference/norm_ref.hpp"
#include "tests/reference/rope_ref.hpp"

namespace ditops::fuzz {
namespace {

/// A power of two the input's rows are scaled by: mostly 1, sometimes near the ends of the
/// dtype's range (f16 holds 2^-14 .. 65504, f32 and bf16 squares overflow from 2^64).
template <class T>
float magnitude(Input& in) {
  if (!in.rarely(8)) return 1.f;
  const bool half = std::is_same_v<T, f16>;
  return std::ldexp(1.f, static_cast<int>(half ? in.size(-12, 10) : in.size(-70, 70)));
}

template <class T>
void scale_values(TestTensor<T>& t, float factor) {
  for (std::int64_t i = 0; i < t.size(); ++i) t.at(i) = from_float<T>(to_float(t.at(i)) * factor);
}

template <class T, class W>
void norm(Input& in) {
  const int rank = static_cast<int>(in.size(1, 4));
  std::vector<std::int64_t> shape;
  for (int d = 0; d + 1 < rank; ++d) shape.push_back(in.size(0, 3));
  const std::int64_t dim = in.rarely(4) ? in.size(0, 300) : in.size(1, 40);
  shape.push_back(dim);
  const bool fused = in.flag();
  TestTensor<T> x(shape, in.size(0, 3)), residual(shape, in.size(0, 3)), out(shape, in.size(0, 3)),
      sum(shape, in.size(0, 3));
  TestTensor<W> weight({dim});
  std::mt19937 rng(in.seed());
  const bool specials = in.rarely(8);
  fill(x, rng, specials);
  fill(residual, rng);
  fill(weight, rng);
  scale_values(x, magnitude<T>(in));
  const bool weighted = in.flag();
  const float eps = in.rarely(4) ? in.edge_float(1e-6f) : 1e-6f;
  // In place (out is x) or a broken view now and then.
  const int variant = static_cast<int>(in.size(0, 9));
  TensorView x_view = x.view(), out_view = out.view(), sum_view = sum.view();
  TensorView weight_view = weighted ? weight.view() : TensorView{};
  bool broken = false;
  // A weight view without data is no weight (TensorView::empty), whatever its shape.
  if (variant == 1) out_view = x_view;
  if (variant == 2) sum_view = x_view;
  if (variant == 3 && rank > 1 && shape[0] > 1) {
    out_view.strides[0] = 0;
    broken = true;
  }
  if (variant == 4 && weighted) {
    weight_view.shape[0] += 1;
    broken = true;
  }
  if (variant == 5 && fused) {
    out_view = sum_view;
    broken = true;
  }
  const auto x_before = x.snapshot(), out_before = out.snapshot(), sum_before = sum.snapshot();
  const std::string context = std::string(fused ? "add_rms_norm " : "rms_norm ") +
                              dtype_name(x.view().dtype) + " weight " +
                              dtype_name(weight.view().dtype);
  // The reference before the call: x may be overwritten in place.
  std::vector<double> weights;
  if (weighted) {
    for (std::int64_t i = 0; i < dim; ++i) weights.push_back(weight.value(i));
  }
  const test::NormReference ref =
      test::norm_reference(x, fused ? &residual : nullptr, weights, double(eps));
  const bool ok = accepted([&] {
    if (fused) {
      add_rms_norm(x_view, residual.view(), weight_view, eps, out_view, sum_view);
    } else {
      rms_norm(x_view, weight_view, eps, out_view);
    }
  });
  if (!ok) {
    expect_unchanged(x, x_before, context + " x");
    expect_unchanged(out, out_before, context + " out");
    expect_unchanged(sum, sum_before, context + " sum_out");
    return;
  }
  expect_canaries(x, context + " x");
  expect_canaries(out, context + " out");
  expect_canaries(sum, context + " sum_out");
  // (Views without elements are not checked for aliasing or strides: nothing is written.)
  if (broken && x.size() > 0) {
    failure(context + ": accepted a broken argument (variant " + std::to_string(variant) + ")");
  }
  if (!(std::isfinite(eps) && eps >= 0.f))
    failure(context + ": accepted eps " + std::to_string(eps));
  if (specials) return;
  const TestTensor<T>& result = out_view.data == x_view.data ? x : out;
  if (out_view.data == x_view.data || out_view.data == out.view().data) {
    check_close(result, ref.out, test::rowwise_tolerance<T>(), context);
  }
}

template <class T, class C>
void rope(Input& in) {
  const bool head_first = in.flag(), interleaved = in.flag();
  const std::int64_t b = in.size(0, 2), s = in.size(0, 9), n = in.size(0, 3);
  const std::int64_t dim = 2 * (in.rarely(4) ? in.size(0, 80) : in.size(1, 20));
  const std::vector<std::int64_t> shape = head_first ? std::vector<std::int64_t>{b, n, s, dim}
                                                     : std::vector<std::int64_t>{b, s, n, dim};
  TestTensor<T> x(shape, in.size(0, 3)), out(shape, in.size(0, 3));
  // Tables [S, D], or rank 4 broadcast to x (each dimension its extent or 1).
  const bool rank4 = in.flag();
  std::vector<std::int64_t> table_shape = {s, dim};
  if (rank4) {
    table_shape = {in.flag() ? shape[0] : 1, in.flag() ? shape[1] : 1, in.flag() ? shape[2] : 1,
                   dim};
  }
  TestTensor<C> cos(table_shape, in.size(0, 2)), sin(table_shape, in.size(0, 2));
  std::mt19937 rng(in.seed());
  const bool specials = in.rarely(8);
  fill(x, rng, specials);
  fill(cos, rng);
  fill(sin, rng);
  scale_values(x, magnitude<T>(in));
  const RotatedMode mode = in.rarely(32) ? static_cast<RotatedMode>(in.size(2, 100))
                           : interleaved ? RotatedMode::rotated_interleaved
                                         : RotatedMode::rotated_half;
  TensorView out_view = in.rarely(4) ? x.view() : out.view();
  bool broken = false;
  if (in.rarely(8)) {
    out_view = cos.view();  // overlapping a table (or a dtype/shape mismatch)
    broken = true;
  }
  auto table = [&](const TestTensor<C>& t) {
    return [&t, &table_shape, head_first, rank4](std::int64_t i0, std::int64_t i1, std::int64_t i2,
                                                 std::int64_t k) {
      const std::int64_t dim_ = table_shape.back();
      if (!rank4) return t.value((head_first ? i2 : i1) * dim_ + k);
      const std::int64_t a = table_shape[0] == 1 ? 0 : i0, b_ = table_shape[1] == 1 ? 0 : i1,
                         c = table_shape[2] == 1 ? 0 : i2;
      return t.value(((a * table_shape[1] + b_) * table_shape[2] + c) * dim_ + k);
    };
  };
  const std::vector<double> ref = test::rope_reference(x, interleaved, table(cos), table(sin));
  // |x cos| + |rot(x) sin| per element: fp32 rounds each product, so the error scales with them
  // when they cancel (the random tables are not a unit circle), not with the result.
  const auto zero = [](std::int64_t, std::int64_t, std::int64_t, std::int64_t) { return 0.0; };
  const std::vector<double> cos_part = test::rope_reference(x, interleaved, table(cos), zero);
  const std::vector<double> sin_part = test::rope_reference(x, interleaved, zero, table(sin));
  const auto x_before = x.snapshot(), out_before = out.snapshot();
  const bool ok = accepted([&] {
    rotary_position_embedding(x.view(), cos.view(), sin.view(), out_view, mode, head_first);
  });
  const std::string context =
      std::string("rotary_position_embedding ") + dtype_name(x.view().dtype) + " tables " +
      dtype_name(cos.view().dtype) + (interleaved ? " interleaved" : " half");
  if (!ok) {
    expect_unchanged(x, x_before, context + " x");
    return expect_unchanged(out, out_before, context + " out");
  }
  expect_canaries(x, context + " x");
  expect_canaries(out, context + " out");
  if (broken && x.size() > 0) failure(context + ": accepted out overlapping cos");
  if (mode != RotatedMode::rotated_half && mode != RotatedMode::rotated_interleaved) {
    failure(context + ": accepted an invalid mode");
  }
  if (specials) return;
  const TestTensor<T>& result = out_view.data == x.view().data ? x : out;
  const Tolerance tol = test::rowwise_tolerance<T>();
  for (std::int64_t i = 0; i < result.size(); ++i) {
    const double want = ref[static_cast<std::size_t>(i)];
    const double bound =
        tol.atol + tol.rtol * (std::fabs(want) + std::fabs(cos_part[i]) + std::fabs(sin_part[i]));
    if (!(std::fabs(result.value(i) - want) <= bound)) {
      failure(context + ": element " + std::to_string(i) + " is " +
              std::to_string(result.value(i)) + ", the reference " + std::to_string(want));
    }
  }
}

}  // namespace
}  // namespace ditops::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ditops;
  fuzz::Input in(data, size);
  fuzz::set_threads(in);
  const bool norm = in.flag(), narrow_params = in.flag();
  switch (in.size(0, 2)) {
    case 0:
      norm ? fuzz::norm<float, float>(in) : fuzz::rope<float, float>(in);
      break;
    case 1:
      if (narrow_params) {
        norm ? fuzz::norm<bf16, bf16>(in) : fuzz::rope<bf16, bf16>(in);
      } else {
        norm ? fuzz::norm<bf16, float>(in) : fuzz::rope<bf16, float>(in);
      }
      break;
    default:
      if (narrow_params) {
        norm ? fuzz::norm<f16, f16>(in) : fuzz::rope<f16, f16>(in);
      } else {
        norm ? fuzz::norm<f16, float>(in) : fuzz::rope<f16, float>(in);
      }
  }
  return 0;
}
