// rotary_position_embedding against the fp64 reference: both modes, both layouts, [S,D] and
// broadcast 4-D tables, f32/bf16/f16 with f32 or same-dtype tables, strided rows, in place,
// 1 and 2 threads; properties; and every class of bad input.

#include <cmath>
#include <cstring>
#include <ditops/rope.hpp>
#include <ditops/runtime.hpp>
#include <limits>
#include <random>
#include <vector>

#include "tests/reference/rope_ref.hpp"
#include "tests/rope/tables.hpp"
#include "tests/support/expect_rejected.hpp"
#include "tests/support/line_offsets.hpp"
#include "tests/support/tolerance.hpp"

namespace ditops::test {
namespace {

// Head dims of DiTs and LLMs (all even) plus widths with tails for 4/8/16 lanes in both the half
// (D/2) and the interleaved (D) loops, and the large widths of the RMSNorm sweep.
const std::int64_t kDims[] = {2, 6, 8, 34, 64, 72, 80, 96, 128, 256, 3072, 5120, 4104};

/// The 4-D kinds broadcast the dims they do not name; heads_only ([1, N, 1, D] or [1, 1, N, D])
/// broadcasts the sequence, x's innermost row dim in BNSD.
enum class TableKind { seq_dim, broadcast_all, per_batch, per_head, heads_only };

template <class T, class C>
struct RopeCase {
  std::int64_t batch, seq, heads, dim;
  bool head_first;
  RotatedMode mode;
  TableKind table;
  std::int64_t pad;
  int threads;
  bool in_place;

  std::string describe() const {
    return std::string("rope x ") + dtype_name(detail::dtype_of<T>()) + " table " +
           dtype_name(detail::dtype_of<C>()) + " B" + std::to_string(batch) + " S" +
           std::to_string(seq) + " N" + std::to_string(heads) + " D" + std::to_string(dim) +
           (head_first ? " BNSD" : " BSND") +
           (mode == RotatedMode::rotated_half ? " half" : " interleaved") + " table kind " +
           std::to_string(static_cast<int>(table)) + " pad " + std::to_string(pad) + " threads " +
           std::to_string(threads) + (in_place ? " in-place" : "") + " isa " + active_isa_name();
  }

  void run_and_check(std::mt19937& rng) const {
    set_num_threads(threads);
    const std::vector<std::int64_t> x_shape =
        head_first ? std::vector<std::int64_t>{batch, heads, seq, dim}
                   : std::vector<std::int64_t>{batch, seq, heads, dim};
    // The table's shape, in x's dimension order.
    std::vector<std::int64_t> t_shape;
    const int seq_dim = head_first ? 2 : 1, head_dim = head_first ? 1 : 2;
    if (table == TableKind::seq_dim) {
      t_shape = {seq, dim};
    } else {
      t_shape = {1, 1, 1, dim};
      if (table != TableKind::heads_only) t_shape[seq_dim] = seq;
      if (table == TableKind::heads_only) t_shape[head_dim] = heads;
      if (table == TableKind::per_batch) t_shape[0] = batch;
      if (table == TableKind::per_head) t_shape[head_dim] = heads;
    }
    TestTensor<T> x(x_shape, pad), out(x_shape, pad + 2);
    RopeTables<C> tables(t_shape, head_first, mode, pad);
    x.fill_normal(rng);
    const auto ref = rope_reference(x, mode == RotatedMode::rotated_interleaved,
                                    tables.lookup(tables.cos), tables.lookup(tables.sin));
    TestTensor<T>& dst = in_place ? x : out;
    rotary_position_embedding(x.view(), tables.cos.view(), tables.sin.view(), dst.view(), mode,
                              head_first);
    expect_close(dst, ref, rowwise_tolerance<T>(), describe());
  }
};

template <class Pair>
class RopeTest : public ::testing::Test {};
template <class T, class C>
struct Types {
  using X = T;
  using Table = C;
};
using RopeTypes = ::testing::Types<Types<float, float>, Types<bf16, float>, Types<bf16, bf16>,
                                   Types<f16, float>, Types<f16, f16>>;
TYPED_TEST_SUITE(RopeTest, RopeTypes);

TYPED_TEST(RopeTest, MatchesReferenceOverSweep) {
  using T = typename TypeParam::X;
  using C = typename TypeParam::Table;
  std::mt19937 rng(42);
  for (std::int64_t dim : kDims) {
    const std::int64_t seq = dim >= 3072 ? 2 : 5;
    for (bool head_first : {false, true}) {
      for (RotatedMode mode : {RotatedMode::rotated_half, RotatedMode::rotated_interleaved}) {
        for (TableKind table : {TableKind::seq_dim, TableKind::broadcast_all, TableKind::per_batch,
                                TableKind::per_head}) {
          for (bool in_place : {false, true}) {
            const std::int64_t pad = in_place ? 0 : 3;
            RopeCase<T, C>{2, seq, 3, dim, head_first, mode, table, pad, 1, in_place}.run_and_check(
                rng);
          }
        }
      }
    }
  }
}

// 16-bit tables read by runs of rows (broadcast along x's innermost row dim: BSND's heads, or
// the sequence of BNSD with [1, N, 1, D] tables) are widened to fp32 once per run: the run
// changes with the position, the batch or the head, a thread's range starts part way into a
// run, and D is odd in halves, short, the largest widened (1024) or just above it (direct).
TYPED_TEST(RopeTest, WidenedTableRowsFollowEveryTableChange) {
  using T = typename TypeParam::X;
  using C = typename TypeParam::Table;
  std::mt19937 rng(11);
  for (std::int64_t dim : {2, 6, 130, 1024, 1026}) {
    // Over 512 KiB of traffic for D >= 130, so that two threads split the rows.
    const std::int64_t seq = dim >= 1024 ? 19 : 131;
    for (RotatedMode mode : {RotatedMode::rotated_half, RotatedMode::rotated_interleaved}) {
      for (bool in_place : {false, true}) {
        const std::int64_t pad = in_place ? 0 : 3;
        for (TableKind table : {TableKind::seq_dim, TableKind::per_batch, TableKind::heads_only}) {
          RopeCase<T, C>{2, seq, 7, dim, false, mode, table, pad, 2, in_place}.run_and_check(rng);
        }
        RopeCase<T, C>{2, seq, 5, dim, true, mode, TableKind::heads_only, pad, 2, in_place}
            .run_and_check(rng);
      }
    }
  }
}

// Big enough (> 512 KiB) that the row split really uses two threads.
TYPED_TEST(RopeTest, TwoThreads) {
  using T = typename TypeParam::X;
  using C = typename TypeParam::Table;
  std::mt19937 rng(7);
  for (bool head_first : {false, true}) {
    for (RotatedMode mode : {RotatedMode::rotated_half, RotatedMode::rotated_interleaved}) {
      RopeCase<T, C>{1, 97, 24, 128, head_first, mode, TableKind::seq_dim, 0, 2, false}
          .run_and_check(rng);
      RopeCase<T, C>{2, 33, 8, 72, head_first, mode, TableKind::per_batch, 5, 2, true}
          .run_and_check(rng);
    }
  }
}

// Properties: a rotation preserves each pair's norm; position 0 with angle 0 is the identity.
TEST(RopeProperties, PreservesPairNormsAndIdentityAtZeroAngle) {
  std::mt19937 rng(3);
  const std::int64_t dim = 128;
  TestTensor<float> x({1, 4, 2, dim}), out({1, 4, 2, dim}), cos_t({4, dim}), sin_t({4, dim});
  x.fill_normal(rng);
  for (std::int64_t s = 0; s < 4; ++s) {
    for (std::int64_t k = 0; k < dim; ++k) {
      const double a = s == 0 ? 0.0 : 0.37 * s * (k / 2 + 1);
      cos_t.at(s * dim + k) = static_cast<float>(std::cos(a));
      sin_t.at(s * dim + k) = static_cast<float>(std::sin(a));
    }
  }
  rotary_position_embedding(x.view(), cos_t.view(), sin_t.view(), out.view(),
                            RotatedMode::rotated_interleaved);
  for (std::int64_t row = 0; row < 8; ++row) {
    for (std::int64_t k = 0; k < dim; k += 2) {
      const std::int64_t i = row * dim + k;
      const double before = std::hypot(x.value(i), x.value(i + 1));
      const double after = std::hypot(out.value(i), out.value(i + 1));
      EXPECT_NEAR(after, before, 1e-5 * (1 + before)) << "row " << row << " pair " << k;
      if (row < 2) {  // sequence position 0: rows 0 and 1 (two heads)
        EXPECT_EQ(out.value(i), x.value(i));
        EXPECT_EQ(out.value(i + 1), x.value(i + 1));
      }
    }
  }
}

// ---- bad input -----------------------------------------------------------------------------

TEST(RopeBadInput, EveryInvalidArgumentThrowsBeforeWriting) {
  TestTensor<float> x({1, 4, 2, 8}), out({1, 4, 2, 8}), cos_t({4, 8}), sin_t({4, 8});
  TestTensor<float> x3({4, 2, 8}), odd({1, 4, 2, 7}), cos_odd({4, 7}), cos_wrong_d({4, 16});
  TestTensor<float> cos_wrong_s({5, 8}), cos_4d_bad({1, 3, 1, 8}), cos_3d({1, 4, 8});
  TestTensor<bf16> cos_bf16({4, 8}), out_bf16({1, 4, 2, 8});
  TestTensor<std::int8_t> x_i8({1, 4, 2, 8});
  const RotatedMode half = RotatedMode::rotated_half;
  auto rope = [&](const TensorView& xv, const TensorView& c, const TensorView& s,
                  const TensorView& o, bool head_first = false) {
    rotary_position_embedding(xv, c, s, o, half, head_first);
  };
  expect_rejected([&] { rope(x3.view(), cos_t.view(), sin_t.view(), out.view()); }, "x has rank 3",
                  out);
  expect_rejected([&] { rope(odd.view(), cos_odd.view(), cos_odd.view(), odd.view()); },
                  "x.shape[3] (7) must be even", out);
  expect_rejected([&] { rope(x.view(), cos_wrong_d.view(), sin_t.view(), out.view()); },
                  "cos.shape[1] (16) must equal x.shape[3] (8)", out);
  expect_rejected([&] { rope(x.view(), cos_wrong_s.view(), sin_t.view(), out.view()); },
                  "cos.shape[0] (5) must equal x.shape[1] (4)", out);
  // [S, D] follows x's sequence dim, which is dim 2 when head_first.
  expect_rejected([&] { rope(x.view(), cos_t.view(), sin_t.view(), out.view(), true); },
                  "cos.shape[0] (4) must equal x.shape[2] (2)", out);
  expect_rejected([&] { rope(x.view(), cos_4d_bad.view(), sin_t.view(), out.view()); },
                  "cos.shape[1] (3) must be 1 or equal x.shape[1] (4)", out);
  expect_rejected([&] { rope(x.view(), cos_3d.view(), sin_t.view(), out.view()); },
                  "cos has rank 3", out);
  expect_rejected([&] { rope(x.view(), cos_t.view(), cos_bf16.view(), out.view()); },
                  "sin.dtype (bf16) must equal cos.dtype (f32)", out);
  expect_rejected([&] { rope(x.view(), cos_bf16.view(), cos_bf16.view(), out.view()); },
                  "cos.dtype is bf16", out);
  expect_rejected([&] { rope(x.view(), cos_t.view(), sin_t.view(), out_bf16.view()); },
                  "out.dtype (bf16) must equal x.dtype (f32)", out);
  expect_rejected([&] { rope(x_i8.view(), cos_t.view(), sin_t.view(), out.view()); },
                  "x.dtype is i8", out);
  TensorView null_sin = sin_t.view();
  null_sin.data = nullptr;
  expect_rejected([&] { rope(x.view(), cos_t.view(), null_sin, out.view()); }, "sin.data is null",
                  out);
  TensorView strided_d = x.view();
  strided_d.shape[3] = 4;
  strided_d.strides[3] = 2;
  TensorView out4 = out.view();
  out4.shape[3] = 4;
  expect_rejected([&] { rope(strided_d, cos_t.view(), sin_t.view(), out4); },
                  "x.strides[3] (2) must be 1", out);
  expect_rejected([&] { rope(x.view(), cos_t.view(), sin_t.view(), cos_t.view()); },
                  "out has rank 2", out);
  TensorView out_over_cos = out.view();  // out spilling over the cos table
  out_over_cos.data = cos_t.view().data;
  out_over_cos.shape = {1, 2, 2, 8};
  TensorView x_small = x.view();
  x_small.shape = {1, 2, 2, 8};
  TensorView cos2 = cos_t.view(), sin2 = sin_t.view();
  cos2.shape[0] = sin2.shape[0] = 2;
  expect_rejected([&] { rope(x_small, cos2, sin2, out_over_cos); }, "out may overlap cos", out);
  expect_rejected(
      [&] {
        rotary_position_embedding(x.view(), cos_t.view(), sin_t.view(), out.view(),
                                  static_cast<RotatedMode>(7));
      },
      "mode (7)", out);
}

}  // namespace
}  // namespace ditops::test

namespace ditops::test {
namespace {

// Outputs above the streaming threshold are written with streaming stores; padding elements per row
// move each row start further, so the rows meet every misalignment, odd ones included (which the
// interleaved mode must handle pair-safely), and no row continues where the previous one ended.
// D = 136 rows are staged; D = 128 f32 rows (whole vectors) are joined into aligned vectors, a
// run per row (simd::ShiftedStreamWriter) where their starts fall on 4 bytes; 16-bit rows are
// not joined, and stream (staged or in place) only from the threshold written.
TYPED_TEST(RopeTest, LargeOutputsUseStreamingStoresCorrectly) {
  using T = typename TypeParam::X;
  using C = typename TypeParam::Table;
  std::mt19937 rng(8);
  for (RotatedMode mode : {RotatedMode::rotated_half, RotatedMode::rotated_interleaved}) {
    // Staged rows stream from the threshold written.
    const std::int64_t seq = streamed_output_bytes() / (8 * 136 * sizeof(T)) + 1;
    for (std::int64_t pad : {1, 2}) {
      RopeCase<T, C>{1, seq, 8, 136, false, mode, TableKind::seq_dim, pad, 2, false}.run_and_check(
          rng);
    }
    // Joined rows stream from the threshold of traffic (x and out); out's pad of 4 keeps its rows
    // on 4 bytes in every dtype.
    const std::int64_t joined_seq = (streamed_output_bytes() / 2) / (8 * 128 * sizeof(T)) + 1;
    RopeCase<T, C>{1, joined_seq, 8, 128, false, mode, TableKind::seq_dim, 2, 2, false}
        .run_and_check(rng);
  }
}

// Buffers as users allocate them: x and out starting at every offset within a cache line
// (16 bytes past one is where malloc and numpy put large arrays). Outputs above the
// streaming threshold are
// streamed, and rows of D = 128 then share lines with their neighbours; whatever the offset,
// the bits must be those of the line-aligned run, 2 threads splitting the rows, nothing written
// outside out, also in place.
template <class T>
void expect_every_line_offset_equal() {
  set_num_threads(2);
  constexpr std::int64_t kHeads = 8, kDim = 128;
  const std::int64_t seq = streamed_output_bytes() / (kHeads * kDim * sizeof(T)) + 1;
  const auto count = static_cast<std::size_t>(seq * kHeads * kDim);
  std::vector<T> cos_t(static_cast<std::size_t>(seq * kDim)), sin_t(cos_t.size()), x0(count);
  std::mt19937 rng(12);
  std::normal_distribution<float> normal;
  for (T& value : x0) value = from_float<T>(normal(rng));
  for (RotatedMode mode : {RotatedMode::rotated_half, RotatedMode::rotated_interleaved}) {
    for (std::int64_t s = 0; s < seq; ++s) {
      for (std::int64_t k = 0; k < kDim; ++k) {
        const double a = rope_angle(0, 0, s, k, kDim, mode);
        cos_t[s * kDim + k] = from_float<T>(static_cast<float>(std::cos(a)));
        sin_t[s * kDim + k] = from_float<T>(static_cast<float>(std::sin(a)));
      }
    }
    const TensorView cos_view = view(cos_t.data(), {seq, kDim});
    const TensorView sin_view = view(sin_t.data(), {seq, kDim});
    OffsetBuffer<T> x(count), out(count);
    std::vector<T> aligned(count);
    // Returns the output of a run with x and out `offset` bytes past a line.
    const auto run = [&](std::size_t offset, bool in_place) {
      T* src = x.place(offset);
      T* dst = in_place ? src : out.place(offset);
      std::memcpy(src, x0.data(), x.bytes());
      rotary_position_embedding(view(src, {1, seq, kHeads, kDim}), cos_view, sin_view,
                                view(dst, {1, seq, kHeads, kDim}), mode);
      EXPECT_TRUE(x.guards_intact() && out.guards_intact()) << "offset " << offset;
      return dst;
    };
    std::memcpy(aligned.data(), run(0, false), x.bytes());
    for (std::size_t offset = sizeof(T); offset < kLineBytes; offset += sizeof(T)) {
      EXPECT_EQ(std::memcmp(run(offset, false), aligned.data(), x.bytes()), 0)
          << dtype_name(detail::dtype_of<T>()) << " mode " << static_cast<int>(mode)
          << ": x and out " << offset << " bytes past a line differ from the aligned run, isa "
          << active_isa_name();
    }
    EXPECT_EQ(std::memcmp(run(16, true), aligned.data(), x.bytes()), 0)
        << "in place, 16 bytes past a line, isa " << active_isa_name();
  }
}

TEST(RopeLineOffsets, LargeOutputsAtEveryOffsetEqualTheAlignedRun) {
  expect_every_line_offset_equal<float>();
  expect_every_line_offset_equal<bf16>();
  expect_every_line_offset_equal<f16>();
}

// Non-finite data is the caller's choice: it propagates to the elements it touches and never
// crashes or writes outside out, in both modes and layouts.
TEST(RopeNonFinite, NanAndInfStayWhereTheyAre) {
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (const RotatedMode mode : {RotatedMode::rotated_half, RotatedMode::rotated_interleaved}) {
    TestTensor<float> x({2, 3, 2, 64}), cos_t({3, 64}), sin_t({3, 64}), out({2, 3, 2, 64});
    std::mt19937 rng(93);
    x.fill_normal(rng);
    cos_t.fill_normal(rng);
    sin_t.fill_normal(rng);
    x.at(0) = kNan;
    x.at(64 + 7) = kInf;
    cos_t.at(64 + 3) = -kInf;
    sin_t.at(2 * 64 + 9) = kNan;
    rotary_position_embedding(x.view(), cos_t.view(), sin_t.view(), out.view(), mode);
    EXPECT_EQ(out.damaged_canaries(), 0);
    EXPECT_TRUE(std::isnan(out.value(0)));
    // Batch 1, position 0 has finite inputs and tables.
    for (std::int64_t e = 0; e < 2 * 64; ++e) {
      EXPECT_TRUE(std::isfinite(out.value(3 * 2 * 64 + e))) << e;
    }
    rotary_position_embedding(x.view(), cos_t.view(), sin_t.view(), x.view(), mode);  // in place
    EXPECT_EQ(x.damaged_canaries(), 0);
  }
}

}  // namespace
}  // namespace ditops::test
