// rms_norm_rotary_position_embedding against the fp64 reference (RMSNorm then RoPE, never
// rounded between): both norm groups (a head; a token's heads), both modes, both layouts, [S, D]
// and broadcast 4-D tables, f32/bf16/f16 with f32 or same-dtype tables and weights, no weight,
// strided rows, in place, 1 and 2 threads, buffers at every offset within a cache line, streamed
// outputs, rows whose fp32 sum of squares is out of range; against the unfused pair; and every
// class of bad input.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ditops/norm.hpp>
#include <ditops/rope.hpp>
#include <ditops/runtime.hpp>
#include <random>
#include <string>
#include <vector>

#include "tests/reference/norm_rope_ref.hpp"
#include "tests/rope/tables.hpp"
#include "tests/support/expect_rejected.hpp"
#include "tests/support/line_offsets.hpp"
#include "tests/support/tolerance.hpp"

namespace ditops::test {
namespace {

// Tolerance: the output is rounded once to T from an fp32 computation. rtol is the row-wise
// operators' (tests/support/tolerance.hpp): for f32 it bounds the error of inv_rms, a common
// factor of the whole group (its sum of squares in 2 x lanes partial sums, then sqrt and
// division), and for bf16 / f16 one rounding of the result (one unit in the last place). The
// fp32 terms of each element (x * inv_rms * weight rounded twice, a product of the rotation
// rounded, then the fused multiply-add or, without FMA on SSE levels, a product and a sum) add
// at most 4 roundings of |n1 cos| + |n2 sin| <= 2 max |n| (|cos|, |sin| <= 1 here), an absolute
// error where the rotation cancels: atol += 8 * 2^-24 * max |n|.
template <class T>
Tolerance norm_rope_tolerance(double normalized_max) {
  Tolerance tol = rowwise_tolerance<T>();
  tol.atol += 8 * 0x1p-24 * normalized_max;
  return tol;
}

// Head dims (all even) with tails for 4/8/16 lanes in both the half (D/2) and the interleaved
// (D) loops, FLUX/Wan's 128, and the width of a whole Wan token as one head.
const std::int64_t kDims[] = {2, 6, 8, 34, 64, 96, 128, 130, 3072};

enum class TableKind { seq_dim, broadcast_all, per_batch, per_head };
enum class WeightKind { none, f32, same_dtype };

/// `count` weights in [0.5, 1.5], exactly representable in W.
template <class W>
std::vector<W> make_weight(std::int64_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(0.5f, 1.5f);
  std::vector<W> weight(static_cast<std::size_t>(count));
  for (W& w : weight) w = from_float<W>(dist(rng));
  return weight;
}

template <class T, class C>
struct NormRopeCase {
  std::int64_t batch, seq, heads, dim;
  bool head_first;
  RotatedMode mode;
  TableKind table;
  bool per_token;  ///< weight [N * D]: a token's heads normalized together
  WeightKind weight;
  std::int64_t pad;  ///< canaries after each row (per-head groups only)
  int threads;
  bool in_place;
  float x_scale = 1.f;  ///< standard deviation of x
  float eps = 1e-6f;

  std::string describe() const {
    return std::string("norm_rope x ") + dtype_name(detail::dtype_of<T>()) + " table " +
           dtype_name(detail::dtype_of<C>()) + " B" + std::to_string(batch) + " S" +
           std::to_string(seq) + " N" + std::to_string(heads) + " D" + std::to_string(dim) +
           (head_first ? " BNSD" : " BSND") +
           (mode == RotatedMode::rotated_half ? " half" : " interleaved") + " table kind " +
           std::to_string(static_cast<int>(table)) + (per_token ? " per-token" : " per-head") +
           " weight kind " + std::to_string(static_cast<int>(weight)) + " pad " +
           std::to_string(pad) + " threads " + std::to_string(threads) +
           (in_place ? " in-place" : "") + " x scale " + std::to_string(x_scale) + " eps " +
           std::to_string(eps) + " isa " + active_isa_name();
  }

  void run_and_check(std::mt19937& rng) const {
    set_num_threads(threads);
    const std::vector<std::int64_t> x_shape =
        head_first ? std::vector<std::int64_t>{batch, heads, seq, dim}
                   : std::vector<std::int64_t>{batch, seq, heads, dim};
    const int seq_dim = head_first ? 2 : 1, head_dim = head_first ? 1 : 2;
    std::vector<std::int64_t> t_shape;
    if (table == TableKind::seq_dim) {
      t_shape = {seq, dim};
    } else {
      t_shape = {1, 1, 1, dim};
      t_shape[seq_dim] = seq;
      if (table == TableKind::per_batch) t_shape[0] = batch;
      if (table == TableKind::per_head) t_shape[head_dim] = heads;
    }
    // A token's heads must be contiguous for a per-token group: no row padding there.
    const std::int64_t x_pad = per_token ? 0 : pad, out_pad = per_token ? 0 : pad + 2;
    TestTensor<T> x(x_shape, x_pad), out(x_shape, out_pad);
    x.fill_normal(rng, 0.f, x_scale);
    RopeTables<C> tables(t_shape, head_first, mode, pad);
    const std::int64_t group = per_token ? heads * dim : dim;
    std::vector<float> weight_f32;
    std::vector<T> weight_same;
    std::vector<double> weight_ref;
    TensorView weight_view;
    if (weight == WeightKind::f32) {
      weight_f32 = make_weight<float>(group, rng);
      weight_ref.assign(weight_f32.begin(), weight_f32.end());
      weight_view = view(weight_f32.data(), {group});
    } else if (weight == WeightKind::same_dtype) {
      weight_same = make_weight<T>(group, rng);
      for (const T& w : weight_same) weight_ref.push_back(to_float(w));
      weight_view = view(weight_same.data(), {group});
    }
    const auto ref =
        norm_rope_reference(x, weight_ref, eps, group, mode == RotatedMode::rotated_interleaved,
                            tables.lookup(tables.cos), tables.lookup(tables.sin));
    TestTensor<T>& dst = in_place ? x : out;
    rms_norm_rotary_position_embedding(x.view(), weight_view, eps, tables.cos.view(),
                                       tables.sin.view(), dst.view(), mode, head_first);
    expect_close(dst, ref.out, norm_rope_tolerance<T>(ref.normalized_max), describe());
  }
};

template <class T, class C>
struct Types {
  using X = T;
  using Table = C;
};
template <class Pair>
class NormRopeTest : public ::testing::Test {};
using NormRopeTypes = ::testing::Types<Types<float, float>, Types<bf16, float>, Types<bf16, bf16>,
                                       Types<f16, float>, Types<f16, f16>>;
TYPED_TEST_SUITE(NormRopeTest, NormRopeTypes);

TYPED_TEST(NormRopeTest, MatchesReferenceOverSweep) {
  using T = typename TypeParam::X;
  using C = typename TypeParam::Table;
  std::mt19937 rng(42);
  int variant = 0;
  for (std::int64_t dim : kDims) {
    const std::int64_t seq = dim >= 3072 ? 2 : 5;
    for (bool head_first : {false, true}) {
      for (RotatedMode mode : {RotatedMode::rotated_half, RotatedMode::rotated_interleaved}) {
        for (TableKind table : {TableKind::seq_dim, TableKind::broadcast_all, TableKind::per_batch,
                                TableKind::per_head}) {
          for (bool per_token : {false, true}) {
            if (per_token && head_first) continue;  // refused (RopeBadInput below)
            for (bool in_place : {false, true}) {
              const auto weight = static_cast<WeightKind>(variant++ % 3);
              // No weight normalizes each head alone: a per-token group needs one.
              if (per_token && weight == WeightKind::none) continue;
              const std::int64_t pad = in_place ? 0 : 3;
              NormRopeCase<T, C>{2,     seq,       3,      dim, head_first, mode,
                                 table, per_token, weight, pad, 1,          in_place}
                  .run_and_check(rng);
            }
          }
        }
      }
    }
  }
}

// Big enough (> 512 KiB moved) that the group split really uses two threads.
TYPED_TEST(NormRopeTest, TwoThreads) {
  using T = typename TypeParam::X;
  using C = typename TypeParam::Table;
  std::mt19937 rng(7);
  for (RotatedMode mode : {RotatedMode::rotated_half, RotatedMode::rotated_interleaved}) {
    for (bool head_first : {false, true}) {
      NormRopeCase<T, C>{
          1, 97, 24, 128, head_first, mode, TableKind::seq_dim, false, WeightKind::f32, 0, 2, false}
          .run_and_check(rng);
    }
    NormRopeCase<T, C>{
        2, 33, 12, 128, false, mode, TableKind::per_batch, true, WeightKind::same_dtype, 0, 2, true}
        .run_and_check(rng);
    NormRopeCase<T, C>{1, 41, 12,   130, false, mode, TableKind::per_head, true, WeightKind::f32,
                       0, 2,  false}
        .run_and_check(rng);
    NormRopeCase<T, C>{2, 33, 8,   72, false, mode, TableKind::per_batch, false, WeightKind::none,
                       5, 2,  true}
        .run_and_check(rng);
  }
}

// Groups whose fp32 sum of squares overflows (|x| ~ 1e25) or underflows with eps = 0 (|x| ~
// 1e-25) are normalized in double: the outputs are those of ordinary rows.
TEST(NormRopeRange, HugeAndTinyRowsNormalizeInDouble) {
  std::mt19937 rng(5);
  for (float x_scale : {1e25f, 1e-25f}) {
    for (RotatedMode mode : {RotatedMode::rotated_half, RotatedMode::rotated_interleaved}) {
      for (bool per_token : {false, true}) {
        NormRopeCase<float, float> f32_case{
            2, 3, 4, 34, false, mode, TableKind::per_head, per_token, WeightKind::f32, 0, 1, false};
        f32_case.x_scale = x_scale;
        f32_case.eps = 0.f;
        f32_case.run_and_check(rng);
        NormRopeCase<bf16, bf16> bf16_case{
            1, 5, 3,   128, false, mode, TableKind::seq_dim, per_token, WeightKind::same_dtype,
            0, 1, true};
        bf16_case.x_scale = x_scale;
        bf16_case.eps = 0.f;
        bf16_case.run_and_check(rng);
      }
    }
  }
}

// ---- buffers at every offset within a cache line, and streamed outputs -----------------------

/// x and out `offset` bytes past a line (out may be x), [batch, seq, heads, dim] BSND, [S, D]
/// tables of T, weight f32 of `group` values: every offset gives the bits of the aligned run,
/// which match the reference; nothing is written outside out.
template <class T>
void expect_every_offset(std::int64_t seq, std::int64_t heads, std::int64_t dim, bool per_token,
                         RotatedMode mode, int threads, bool every_offset) {
  set_num_threads(threads);
  const auto count = static_cast<std::size_t>(seq * heads * dim);
  const std::int64_t group = per_token ? heads * dim : dim;
  std::mt19937 rng(11);
  const std::vector<T> x0 = normal_values<T>(count, 13);
  std::vector<float> weight = make_weight<float>(group, rng);
  RopeTables<T> tables({seq, dim}, false, mode, 0);
  OffsetBuffer<T> x(count), out(count);
  const std::string context = std::string(dtype_name(detail::dtype_of<T>())) + " S" +
                              std::to_string(seq) + " N" + std::to_string(heads) + " D" +
                              std::to_string(dim) + (per_token ? " per-token" : " per-head") +
                              " mode " + std::to_string(static_cast<int>(mode)) + " threads " +
                              std::to_string(threads);
  const auto run = [&](std::size_t offset, bool in_place) {
    T* src = x.place_copy(offset, x0);
    T* dst = in_place ? src : out.place(offset);
    rms_norm_rotary_position_embedding(view(src, {1, seq, heads, dim}),
                                       view(weight.data(), {group}), 1e-6f, tables.cos.view(),
                                       tables.sin.view(), view(dst, {1, seq, heads, dim}), mode);
    EXPECT_TRUE(x.guards_intact() && out.guards_intact()) << context << " offset " << offset;
    return bytes_of(dst, count);
  };
  const std::vector<std::byte> aligned = run(0, false);
  // The aligned run against the reference.
  TestTensor<T> x_tensor({1, seq, heads, dim}), got({1, seq, heads, dim});
  std::memcpy(&x_tensor.at(0), x0.data(), count * sizeof(T));
  std::memcpy(&got.at(0), aligned.data(), count * sizeof(T));
  const auto ref = norm_rope_reference(x_tensor, std::vector<double>(weight.begin(), weight.end()),
                                       1e-6, group, mode == RotatedMode::rotated_interleaved,
                                       tables.lookup(tables.cos), tables.lookup(tables.sin));
  expect_close(got, ref.out, norm_rope_tolerance<T>(ref.normalized_max), context);
  if (every_offset) {
    expect_every_offset_equals_aligned(
        sizeof(T), [&](std::size_t offset) { return run(offset, false); }, context);
  }
  EXPECT_TRUE(run(16, false) == aligned) << context << ": 16 bytes past a line";
  EXPECT_TRUE(run(16, true) == aligned) << context << ": in place, 16 bytes past a line";
}

TEST(NormRopeLineOffsets, EveryOffsetEqualsTheAlignedRun) {
  for (RotatedMode mode : {RotatedMode::rotated_half, RotatedMode::rotated_interleaved}) {
    for (bool per_token : {false, true}) {
      for (int threads : {1, 2}) {
        expect_every_offset<float>(37, 6, 128, per_token, mode, threads, true);
        expect_every_offset<bf16>(37, 6, 130, per_token, mode, threads, true);
        expect_every_offset<f16>(29, 4, 6, per_token, mode, threads, true);
      }
    }
  }
}

// Outputs from the streaming threshold on are written with streaming stores: rows that share cache
// lines (16 bytes past a line) are staged, and a token's heads complete each other's lines.
TEST(NormRopeLineOffsets, StreamedOutputsEqualTheAlignedRun) {
  for (bool per_token : {false, true}) {
    for (RotatedMode mode : {RotatedMode::rotated_half, RotatedMode::rotated_interleaved}) {
      const std::int64_t seq = streamed_output_bytes() / (12 * 128 * sizeof(float)) + 1;
      expect_every_offset<float>(seq, 12, 128, per_token, mode, 2, false);
    }
    // 16-bit rows pack pairs of vectors into one store (the interleaved rows as f32's).
    const std::int64_t bf16_seq = streamed_output_bytes() / (12 * 128 * sizeof(bf16)) + 1;
    expect_every_offset<bf16>(bf16_seq, 12, 128, per_token, RotatedMode::rotated_half, 2, false);
  }
}

// ---- against the unfused pair ----------------------------------------------------------------

// rms_norm then rotary_position_embedding rounds the normalized values to T once more: in f32
// the two agree to a few units of 2^-24 (of max |n|), in bf16 to that rounding (2^-9 of |n|,
// carried through a rotation: <= 2^-9 (|n1| + |n2|)) plus the two roundings of the outputs.
template <class T>
void expect_close_to_unfused(std::int64_t group_heads, double rtol, double atol_per_n) {
  set_num_threads(1);
  constexpr std::int64_t kSeq = 9, kHeads = 6, kDim = 128;
  std::mt19937 rng(21);
  TestTensor<T> x({2, kSeq, kHeads, kDim}), fused({2, kSeq, kHeads, kDim}),
      normalized({2, kSeq, kHeads, kDim}), unfused({2, kSeq, kHeads, kDim});
  x.fill_normal(rng);
  std::vector<float> weight = make_weight<float>(group_heads * kDim, rng);
  for (RotatedMode mode : {RotatedMode::rotated_half, RotatedMode::rotated_interleaved}) {
    RopeTables<float> tables({kSeq, kDim}, false, mode, 0);
    rms_norm_rotary_position_embedding(x.view(), view(weight.data(), {group_heads * kDim}), 1e-6f,
                                       tables.cos.view(), tables.sin.view(), fused.view(), mode);
    TensorView grouped_x = x.view(), grouped_normalized = normalized.view();
    if (group_heads > 1) {  // rms_norm over [2, S, N * D]
      grouped_x = view(&x.at(0), {2, kSeq, kHeads * kDim});
      grouped_normalized = view(&normalized.at(0), {2, kSeq, kHeads * kDim});
    }
    rms_norm(grouped_x, view(weight.data(), {group_heads * kDim}), 1e-6f, grouped_normalized);
    rotary_position_embedding(normalized.view(), tables.cos.view(), tables.sin.view(),
                              unfused.view(), mode);
    double normalized_max = 0;
    for (std::int64_t i = 0; i < x.size(); ++i) {
      normalized_max = std::max(normalized_max, std::fabs(normalized.value(i)));
    }
    std::vector<double> want(static_cast<std::size_t>(x.size()));
    for (std::int64_t i = 0; i < x.size(); ++i) want[i] = unfused.value(i);
    expect_close(fused, want, Tolerance{rtol, atol_per_n * normalized_max},
                 std::string("fused vs unfused ") + dtype_name(detail::dtype_of<T>()) +
                     " group heads " + std::to_string(group_heads) + " isa " + active_isa_name());
  }
}

TEST(NormRopeUnfused, DiffersByOneRoundingOfTheNormalizedValues) {
  for (std::int64_t group_heads : {1, 6}) {
    expect_close_to_unfused<float>(group_heads, 2e-5, 16 * 0x1p-24);
    expect_close_to_unfused<bf16>(group_heads, 2 * 0x1p-8, 2 * 0x1p-9);
  }
}

// ---- bad input -----------------------------------------------------------------------------

TEST(NormRopeBadInput, EveryInvalidArgumentThrowsBeforeWriting) {
  TestTensor<float> x({1, 4, 2, 8}), out({1, 4, 2, 8}), cos_t({4, 8}), sin_t({4, 8});
  TestTensor<float> x_padded({1, 4, 2, 8}, 4), out_padded({1, 4, 2, 8}, 4);
  TestTensor<float> odd({1, 4, 2, 7}), cos_odd({4, 7}), x3({4, 2, 8});
  TestTensor<bf16> out_bf16({1, 4, 2, 8}), cos_bf16({4, 8});
  std::vector<float> head_weight(8, 1.f), token_weight(16, 1.f), wrong_weight(12, 1.f),
      matrix_weight(16, 1.f);
  std::vector<f16> f16_weight(8);
  std::vector<std::int8_t> i8_weight(8);
  const TensorView w = view(head_weight.data(), {8});
  const RotatedMode half = RotatedMode::rotated_half;
  auto call = [&](const TensorView& xv, const TensorView& wv, const TensorView& c,
                  const TensorView& s, const TensorView& o, bool head_first = false,
                  float eps = 1e-6f) {
    rms_norm_rotary_position_embedding(xv, wv, eps, c, s, o, half, head_first);
  };
  expect_rejected(
      [&] {
        call(x.view(), view(wrong_weight.data(), {12}), cos_t.view(), sin_t.view(), out.view());
      },
      "rms_norm_rotary_position_embedding: weight.shape[0] (12) must be D (8", out);
  expect_rejected(
      [&] {
        call(x.view(), view(matrix_weight.data(), {2, 8}), cos_t.view(), sin_t.view(), out.view());
      },
      "weight has rank 2", out);
  // A token's heads together need them contiguous, in x and in out.
  expect_rejected(
      [&] {
        call(x_padded.view(), view(token_weight.data(), {16}), cos_t.view(), sin_t.view(),
             out.view());
      },
      "x.strides[2] (12) must be D (8)", out);
  expect_rejected(
      [&] {
        call(x.view(), view(token_weight.data(), {16}), cos_t.view(), sin_t.view(),
             out_padded.view());
      },
      "out.strides[2] (12) must be D (8)", out_padded);
  TestTensor<float> x_bnsd({1, 2, 4, 8}), out_bnsd({1, 2, 4, 8});
  expect_rejected(
      [&] {
        call(x_bnsd.view(), view(token_weight.data(), {16}), cos_t.view(), sin_t.view(),
             out_bnsd.view(), true);
      },
      "needs head_first = false", out_bnsd);
  expect_rejected(
      [&] { call(x.view(), view(f16_weight.data(), {8}), cos_t.view(), sin_t.view(), out.view()); },
      "weight.dtype is f16", out);
  expect_rejected(
      [&] { call(x.view(), view(i8_weight.data(), {8}), cos_t.view(), sin_t.view(), out.view()); },
      "weight.dtype is i8", out);
  expect_rejected([&] { call(x.view(), w, cos_t.view(), sin_t.view(), out_bf16.view()); },
                  "out.dtype (bf16) must equal x.dtype (f32)", out_bf16);
  expect_rejected([&] { call(x.view(), w, cos_bf16.view(), cos_bf16.view(), out.view()); },
                  "cos.dtype is bf16", out);
  expect_rejected([&] { call(x.view(), w, cos_t.view(), cos_bf16.view(), out.view()); },
                  "sin.dtype (bf16) must equal cos.dtype (f32)", out);
  expect_rejected([&] { call(x3.view(), w, cos_t.view(), sin_t.view(), out.view()); },
                  "x has rank 3", out);
  expect_rejected([&] { call(odd.view(), w, cos_odd.view(), cos_odd.view(), odd.view()); },
                  "x.shape[3] (7) must be even", out);
  expect_rejected([&] { call(x.view(), w, cos_t.view(), sin_t.view(), out.view(), true); },
                  "cos.shape[0] (4) must equal x.shape[2] (2)", out);
  expect_rejected([&] { call(x.view(), w, cos_t.view(), sin_t.view(), out.view(), false, -1.f); },
                  "eps (-1.000000) must be finite and >= 0", out);
  expect_rejected(
      [&] {
        rms_norm_rotary_position_embedding(x.view(), w, 1e-6f, cos_t.view(), sin_t.view(),
                                           out.view(), static_cast<RotatedMode>(7));
      },
      "mode (7)", out);
  // Overlaps: out over the weight, over a table, and over x without being x.
  std::vector<float> shared(64 + 8, 0.f);
  const TensorView out_over_weight = view(shared.data(), {1, 4, 2, 8});
  expect_rejected(
      [&] {
        call(x.view(), view(shared.data() + 56, {8}), cos_t.view(), sin_t.view(), out_over_weight);
      },
      "out may overlap weight", out);
  TensorView out_over_cos = view(&cos_t.at(0), {1, 2, 2, 8});
  TensorView x_small = view(&x.at(0), {1, 2, 2, 8});
  TensorView cos2 = view(&cos_t.at(0), {2, 8}), sin2 = view(&sin_t.at(0), {2, 8});
  expect_rejected([&] { call(x_small, w, cos2, sin2, out_over_cos); }, "out may overlap cos", out);
  TensorView x_shifted = view(&x.at(0) + 8, {1, 2, 2, 8});
  expect_rejected([&] { call(x_shifted, w, cos2, sin2, x_small); }, "out may overlap x", x);
}

}  // namespace
}  // namespace ditops::test
