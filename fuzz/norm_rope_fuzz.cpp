// rms_norm_rotary_position_embedding over its argument space: x in f32, bf16 or f16 with the
// weight in f32, x's dtype or absent and the tables in f32 or x's dtype; both norm groups (a
// weight of D: each head; of N * D: a token's heads together), including the invalid ones (wrong
// lengths, N * D with head_first, a token's heads apart through row padding); [S, D] and rank-4
// broadcast tables, both modes and layouts, x broadcast along a leading dimension, strided rows,
// in place, eps at its edges, groups of any magnitude (fp32 sums of squares that overflow or
// underflow) and all-zero ones, invalid enums, broken views and every overlap. Each input's call
// must be refused exactly when an argument is invalid, a refusal must leave every buffer as it
// was, and an accepted call must write nothing but out and match the fp64 reference.

#include <ditops/rope.hpp>
#include <type_traits>
#include <utility>

#include "fuzz/support.hpp"
#include "tests/reference/norm_rope_ref.hpp"

namespace ditops::fuzz {
namespace {

/// The exponents of the powers of two x's rows are scaled by: f16 holds 2^-14 .. 65504; f32 and
/// bf16 sums of squares overflow fp32 from 2^64 and underflow below 2^-63 (the kernel normalizes
/// such groups in double).
template <class T>
std::pair<int, int> exponent_range() {
  return std::is_same_v<T, f16> ? std::pair{-12, 10} : std::pair{-70, 70};
}

/// A dtype of `dtype`'s width that is neither f32 nor `dtype` (f32 -> i32, bf16 <-> f16): where
/// `dtype` is x's or f32, one the argument may not have, and a call that wrongly accepted it
/// would still read and write within the buffers.
DType wrong_dtype(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return DType::f16;
    case DType::f16:
      return DType::bf16;
    default:
      return DType::i32;
  }
}

template <class T, class W, class C>
void norm_rope(Input& in) {
  const bool head_first = in.flag(), interleaved = in.flag();
  const std::int64_t b = in.size(0, 2), s = in.size(0, 9), n = in.size(0, 4);
  // Head dims up to 160 (tails of every vector width), now and then past 1024 (16-bit tables are
  // then read as they are instead of widened once per run of rows sharing them).
  const std::int64_t dim = 2 * (in.rarely(8)   ? in.size(500, 560)
                                : in.rarely(4) ? in.size(0, 80)
                                               : in.size(1, 20));
  const std::vector<std::int64_t> shape = head_first ? std::vector<std::int64_t>{b, n, s, dim}
                                                     : std::vector<std::int64_t>{b, s, n, dim};
  const std::int64_t elements = b * s * n * dim;
  // The norm group: a weight of D (or none) normalizes each head, one of N * D each token's heads
  // together (valid with head_first = false and the heads contiguous).
  const bool weighted = !in.rarely(4);
  const bool per_token = weighted && in.flag();
  const std::int64_t weight_length = per_token ? n * dim : dim;
  // Row padding separates a token's heads, which a per-token group refuses: mostly none there.
  const bool padded = !per_token || in.rarely(4);
  const std::int64_t x_pad = padded ? in.size(0, 3) : 0, out_pad = padded ? in.size(0, 3) : 0;
  // x broadcast along a leading dimension (stride 0: an input may, out may not).
  int broadcast_dim = -1;
  if (in.rarely(8)) {
    const int d = static_cast<int>(in.size(0, 2));
    if (shape[d] > 1) broadcast_dim = d;
  }
  std::vector<std::int64_t> stored_shape = shape;
  if (broadcast_dim >= 0) stored_shape[broadcast_dim] = 1;
  TestTensor<T> x(stored_shape, x_pad), out(shape, out_pad);
  TestTensor<W> weight({weight_length});
  // Tables [S, D], or rank 4 broadcast to x (each dimension its extent or 1).
  const bool rank4 = in.flag();
  std::vector<std::int64_t> table_shape = {s, dim};
  if (rank4) {
    table_shape = {in.flag() ? shape[0] : 1, in.flag() ? shape[1] : 1, in.flag() ? shape[2] : 1,
                   dim};
  }
  TestTensor<C> cos(table_shape, in.size(0, 2)), sin(table_shape, in.size(0, 2));

  std::mt19937 rng(in.seed());
  // A NaN or infinity in x, the weight or a table now and then: only the canaries and the
  // untouched inputs are checked then.
  const int special = in.rarely(8) ? static_cast<int>(in.size(0, 3)) : -1;
  fill(x, rng, special == 0);
  fill(weight, rng, special == 1);
  fill(cos, rng, special == 2);
  fill(sin, rng, special == 3);
  // Rows scaled by powers of two: mostly 1, sometimes all by one near the ends of the dtype's
  // range, sometimes each by its own (a group of fp32 range beside one out of it).
  const auto [low, high] = exponent_range<T>();
  const bool mixed = in.rarely(8);
  const int call_exponent = in.rarely(8) ? static_cast<int>(in.size(low, high)) : 0;
  std::uniform_int_distribution<int> row_exponent(low, high);
  for (std::int64_t row = 0; dim > 0 && row < x.size() / dim; ++row) {
    const float factor = std::ldexp(1.f, mixed ? row_exponent(rng) : call_exponent);
    for (std::int64_t k = row * dim; k < (row + 1) * dim; ++k) {
      x.at(k) = from_float<T>(to_float(x.at(k)) * factor);
    }
  }
  // x's logical element i in its storage (a broadcast dimension reads index 0).
  const auto stored = [&](std::int64_t i) {
    std::int64_t index[4], rest = i;
    for (int d = 3; d >= 0; --d) {
      index[d] = rest % shape[d];
      rest /= shape[d];
    }
    if (broadcast_dim >= 0) index[broadcast_dim] = 0;
    return ((index[0] * stored_shape[1] + index[1]) * stored_shape[2] + index[2]) * dim + index[3];
  };
  // An all-zero group: with eps 0 its rms is 0 and the documented formula gives 0 * inf = NaN.
  const std::int64_t group = weighted ? weight_length : dim;
  if (group > 0 && elements > 0 && in.rarely(16)) {
    const std::int64_t zeroed =
        std::uniform_int_distribution<std::int64_t>(0, elements / group - 1)(rng);
    for (std::int64_t i = zeroed * group; i < (zeroed + 1) * group; ++i) x.at(stored(i)) = T{};
  }
  float eps = 1e-6f;
  switch (in.size(0, 7)) {
    case 0:
      eps = in.edge_float(1e-6f);
      break;
    case 1:
      eps = 0.f;
      break;
    case 2:  // around the kernel's choice of the fp64 path (sum < 2^-100 where eps < 2^-80)
      eps = in.pick({-0.f, FLT_MIN / 4, 0x1p-81f, 0x1p-80f, 1.f, FLT_MAX, -FLT_MIN});
      break;
    default:
      break;
  }
  const RotatedMode mode = in.rarely(32) ? static_cast<RotatedMode>(in.size(2, 100))
                           : interleaved ? RotatedMode::rotated_interleaved
                                         : RotatedMode::rotated_half;

  // The views, valid so far; then at most one broken argument, or a valid variant.
  const bool in_place = in.rarely(4), sin_is_cos = in.rarely(16);
  TensorView x_view = x.view();
  if (broadcast_dim >= 0) {
    x_view.shape[broadcast_dim] = shape[broadcast_dim];
    x_view.strides[broadcast_dim] = 0;
  }
  TensorView out_view = in_place ? x_view : out.view();
  TensorView weight_view = weighted ? weight.view() : TensorView{};
  TensorView cos_view = cos.view(), sin_view = sin_is_cos ? cos.view() : sin.view();
  std::string broken;  // why the call must be refused; empty where it must be accepted
  if (in_place && broadcast_dim >= 0) broken = "out is x broadcast (stride 0)";
  if (mode != RotatedMode::rotated_half && mode != RotatedMode::rotated_interleaved) {
    broken = "an invalid mode";
  }
  if (!(std::isfinite(eps) && eps >= 0.f)) broken = "eps " + std::to_string(eps);
  const int leading = static_cast<int>(in.size(0, 2));  // the dimension a variant alters
  switch (in.flag() ? 0 : in.size(1, 21)) {
    case 1:  // a weight view without data is no weight, whatever its shape
      weight_view.data = nullptr;
      break;
    case 2:  // out over a table (or of its shape and dtype)
      out_view = cos_view;
      broken = "out overlapping cos";
      break;
    case 3:  // the weight inside out
      weight_view = out_view;
      weight_view.rank = 1;
      weight_view.shape[0] = weight_length;
      weight_view.strides[0] = 1;
      broken = "out overlapping the weight";
      break;
    case 4:  // out overlapping x without being x
      out_view = x_view;
      out_view.data = static_cast<T*>(x_view.data) + 1;
      broken = "out overlapping x";
      break;
    case 5:
      if (shape[leading] > 1) {
        out_view.strides[leading] = 0;
        broken = "out with stride 0";
      }
      break;
    case 6:
      out_view.dtype = wrong_dtype(out_view.dtype);
      broken = "out of another dtype";
      break;
    case 7:
      if (!weight_view.empty()) {
        weight_view.shape[0] += in.flag() ? 1 : -1;
        broken = "a weight of neither D nor N * D";
      }
      break;
    case 8:
      if (!weight_view.empty()) {
        weight_view.dtype = wrong_dtype(weight_view.dtype);
        broken = "a weight of another dtype";
      }
      break;
    case 9:
      if (!weight_view.empty()) {
        weight_view.rank = 2;
        weight_view.shape = {1, weight_length};
        weight_view.strides = {weight_length, 1};
        broken = "a weight of rank 2";
      }
      break;
    case 10:
      if (!weight_view.empty() && weight_length > 1) {
        weight_view.strides[0] = 2;
        broken = "a strided weight";
      }
      break;
    case 11:
      if (dim > 0) {
        x_view.shape[3] -= 1;
        out_view.shape[3] -= 1;
        broken = "an odd D";
      }
      break;
    case 12:
      x_view.strides[leading] = -x_view.strides[leading] - 1;
      broken = "x with a negative stride";
      break;
    case 13:
      if (dim > 1) {
        x_view.strides[3] = 2;
        broken = "x's rows not contiguous";
      }
      break;
    case 14:
      x_view.rank = 3;
      broken = "x of rank 3";
      break;
    case 15:
      cos_view.shape[cos_view.rank - 1] += 2;
      broken = "cos rows not of D";
      break;
    case 16:
      cos_view.rank = 3;
      broken = "cos of rank 3";
      break;
    case 17:
      sin_view.dtype = wrong_dtype(sin_view.dtype);
      broken = "sin of another dtype than cos";
      break;
    case 18:
      cos_view.dtype = sin_view.dtype = wrong_dtype(x_view.dtype);
      broken = "tables of neither f32 nor x's dtype";
      break;
    case 19:  // S, or a rank-4 table's dimension neither 1 nor x's extent
      if (rank4) {
        cos_view.shape[leading] = shape[leading] + 2;
      } else {
        cos_view.shape[0] = s + 2;
      }
      broken = "cos not broadcastable to x";
      break;
    case 20:
      out_view.shape[leading] += 1;
      broken = "out of another shape";
      break;
    case 21:
      x_view.data = nullptr;
      broken = "x without data";
      break;
    default:
      break;
  }
  // A weight of N * D (other than D): refused with head_first, or where a token's heads are
  // apart in x or out.
  const bool has_weight = !weight_view.empty();
  if (broken.empty() && has_weight && weight_length != dim) {
    if (head_first) broken = "a weight of N * D with head_first";
    for (const TensorView* v : {&x_view, &out_view}) {
      if (v->shape[2] > 1 && v->strides[2] != dim) broken = "a token's heads apart";
    }
  }

  const std::string context =
      std::string("rms_norm_rotary_position_embedding x ") + dtype_name(x.view().dtype) +
      " weight " + (has_weight ? dtype_name(weight.view().dtype) : "none") + " tables " +
      dtype_name(cos.view().dtype) + (interleaved ? " interleaved" : " half") +
      (head_first ? " BNSD" : " BSND") + " group " + std::to_string(group) + " D " +
      std::to_string(dim) + " eps " + std::to_string(eps) + (in_place ? " in place" : "");

  // The reference before the call (in place overwrites x), from x's logical elements.
  const bool check = broken.empty() && special < 0;
  test::NormRopeReference ref, cos_part, sin_part;
  if (check) {
    TestTensor<T> logical(shape);
    for (std::int64_t i = 0; i < elements; ++i) logical.at(i) = x.at(stored(i));
    std::vector<double> weights;
    if (has_weight) {
      for (std::int64_t i = 0; i < weight_length; ++i) weights.push_back(weight.value(i));
    }
    const auto table = [&](const TestTensor<C>& t) -> test::RopeTableLookup {
      return [&t, &table_shape, head_first, rank4](std::int64_t i0, std::int64_t i1,
                                                   std::int64_t i2, std::int64_t k) {
        const std::int64_t d = table_shape.back();
        if (!rank4) return t.value((head_first ? i2 : i1) * d + k);
        const std::int64_t a = table_shape[0] == 1 ? 0 : i0, c1 = table_shape[1] == 1 ? 0 : i1,
                           c2 = table_shape[2] == 1 ? 0 : i2;
        return t.value(((a * table_shape[1] + c1) * table_shape[2] + c2) * d + k);
      };
    };
    const TestTensor<C>& sin_table = sin_is_cos ? cos : sin;
    const std::int64_t ref_group = has_weight ? weight_length : dim;
    ref = test::norm_rope_reference(logical, weights, double(eps), ref_group, interleaved,
                                    table(cos), table(sin_table));
    // |n cos| and |rot(n) sin| per element: fp32 rounds each product and the error of inv_rms
    // scales them, so where they cancel (the random tables are not a unit circle) the error
    // scales with them, not with the result.
    const test::RopeTableLookup zero = [](std::int64_t, std::int64_t, std::int64_t, std::int64_t) {
      return 0.0;
    };
    cos_part = test::norm_rope_reference(logical, weights, double(eps), ref_group, interleaved,
                                         table(cos), zero);
    sin_part = test::norm_rope_reference(logical, weights, double(eps), ref_group, interleaved,
                                         zero, table(sin_table));
  }

  const auto x_before = x.snapshot(), out_before = out.snapshot();
  const auto weight_before = weight.snapshot();
  const auto cos_before = cos.snapshot(), sin_before = sin.snapshot();
  const bool ok = accepted([&] {
    rms_norm_rotary_position_embedding(x_view, weight_view, eps, cos_view, sin_view, out_view, mode,
                                       head_first);
  });
  expect_unchanged(weight, weight_before, context + " weight");
  expect_unchanged(cos, cos_before, context + " cos");
  expect_unchanged(sin, sin_before, context + " sin");
  if (!ok) {
    if (broken.empty()) failure(context + ": refused a valid call");
    expect_unchanged(x, x_before, context + " x");
    return expect_unchanged(out, out_before, context + " out");
  }
  // (Calls on no elements are not checked for aliasing or strides: nothing is written.)
  if (!broken.empty() && elements > 0) failure(context + ": accepted " + broken);
  expect_canaries(x, context + " x");
  expect_canaries(out, context + " out");
  if (!in_place) expect_unchanged(x, x_before, context + " x (not in place)");
  if (!check) return;
  const TestTensor<T>& result = in_place ? x : out;
  const Tolerance tol = test::rowwise_tolerance<T>();
  for (std::int64_t i = 0; i < elements; ++i) {
    const double got = result.value(i), want = ref.out[static_cast<std::size_t>(i)];
    // An all-zero group with eps 0: the reference's 0 * inf, which the output must give too.
    if (std::isnan(want) && std::isnan(got)) continue;
    const double bound = tol.atol + tol.rtol * (std::fabs(want) + std::fabs(cos_part.out[i]) +
                                                std::fabs(sin_part.out[i]));
    if (!(std::fabs(got - want) <= bound)) {
      failure(context + ": element " + std::to_string(i) + " is " + std::to_string(got) +
              ", the reference " + std::to_string(want));
    }
  }
}

/// x of T: the weight and the tables each in f32 or T.
template <class T>
void narrow(Input& in, bool weight_like_x, bool tables_like_x) {
  if (weight_like_x) {
    tables_like_x ? norm_rope<T, T, T>(in) : norm_rope<T, T, float>(in);
  } else {
    tables_like_x ? norm_rope<T, float, T>(in) : norm_rope<T, float, float>(in);
  }
}

}  // namespace
}  // namespace ditops::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ditops;
  fuzz::Input in(data, size);
  fuzz::set_threads(in);
  const bool weight_like_x = in.flag(), tables_like_x = in.flag();
  switch (in.size(0, 2)) {
    case 0:
      fuzz::norm_rope<float, float, float>(in);
      break;
    case 1:
      fuzz::narrow<bf16>(in, weight_like_x, tables_like_x);
      break;
    default:
      fuzz::narrow<f16>(in, weight_like_x, tables_like_x);
  }
  return 0;
}
