// merge_attention_states against fp64: the weighted combination of two rows over random lse
// pairs (equal, far apart, -inf on one side or both), every dtype combination, strided and in
// place; the merge of the fp64 attentions over two key halves against the attention over all
// keys; thread counts; every class of bad input.

#include <cmath>
#include <cstring>
#include <ditops/attention.hpp>
#include <ditops/runtime.hpp>
#include <limits>
#include <random>
#include <vector>

#include "tests/reference/attention_ref.hpp"
#include "tests/support/expect_rejected.hpp"
#include "tests/support/line_offsets.hpp"
#include "tests/support/test_tensor.hpp"

namespace ditops::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

/// Unit roundoff of T's storage: the one rounding of a bf16 / f16 output (the merge itself
/// runs in fp32).
template <class T>
double storage_epsilon() {
  if constexpr (std::is_same_v<T, bf16>) return 0x1p-8;
  if constexpr (std::is_same_v<T, f16>) return 0x1p-11;
  return 0.0;
}

struct Shape {
  std::int64_t b, s, n, d;
  std::vector<std::int64_t> out() const { return {b, s, n, d}; }
  std::vector<std::int64_t> lse() const { return {b, n, s}; }
};

/// One merge with its fp64 reference. out_a / out_b / out of types A, B, O.
template <class A, class B, class O>
struct MergeCase {
  Shape shape;
  TestTensor<A> out_a;
  TestTensor<B> out_b;
  TestTensor<O> out;
  TestTensor<float> lse_a, lse_b, lse;

  explicit MergeCase(Shape s, std::int64_t pad = 0)
      : shape(s),
        out_a(s.out(), pad),
        out_b(s.out(), 2 * pad),
        out(s.out(), pad),
        lse_a(s.lse(), pad),
        lse_b(s.lse()),
        lse(s.lse(), 3 * pad) {}

  /// Random rows; lse pairs cycle through equal, close, far apart, one side -inf (that side's
  /// row NaN: it must not be read) and both -inf.
  void fill(std::mt19937& rng) {
    out_a.fill_normal(rng);
    out_b.fill_normal(rng, 0.5f, 2.f);
    std::normal_distribution<float> level(0.f, 3.f);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (std::int64_t row = 0; row < lse_a.size(); ++row) {
      float a = level(rng), b = level(rng);
      switch (row % 7) {
        case 0:
          b = a;
          break;
        case 1:
          b = a + 60.f;
          break;  // out_b's weight is e^-60 relative: a's side underflows
        case 2:
          a = -kInf;
          break;
        case 3:
          b = -kInf;
          break;
        case 4:
          a = b = -kInf;
          break;
        default:
          break;
      }
      lse_a.at(row) = a;
      lse_b.at(row) = b;
    }
    // A side whose lse is -inf holds NaN (rows another library left unwritten).
    for (std::int64_t i = 0; i < out_a.size(); ++i) {
      const std::int64_t d = i % shape.d, row_bsn = i / shape.d;
      const std::int64_t n = row_bsn % shape.n, s = row_bsn / shape.n % shape.s,
                         bi = row_bsn / (shape.n * shape.s);
      const std::int64_t lse_row = (bi * shape.n + n) * shape.s + s;
      if (lse_a.at(lse_row) == -kInf) out_a.at(i) = from_float<A>(nan);
      if (lse_b.at(lse_row) == -kInf) out_b.at(i) = from_float<B>(nan);
      (void)d;
    }
  }

  void run() {
    merge_attention_states(out_a.view(), lse_a.view(), out_b.view(), lse_b.view(), out.view(),
                           lse.view());
  }

  /// Compares out and lse with the fp64 merge of the inputs as stored.
  void check(const std::string& what) const {
    std::int64_t failures = 0;
    for (std::int64_t bi = 0; bi < shape.b; ++bi) {
      for (std::int64_t s = 0; s < shape.s; ++s) {
        for (std::int64_t n = 0; n < shape.n; ++n) {
          const std::int64_t lse_row = (bi * shape.n + n) * shape.s + s;
          const double la = lse_a.value(lse_row), lb = lse_b.value(lse_row);
          const double top = std::max(la, lb);
          double wa = 0, wb = 0, ref_lse = -kInf;
          if (top != -kInf) {
            wa = std::exp(la - top);
            wb = std::exp(lb - top);
            ref_lse = top + std::log(wa + wb);
            const double total = wa + wb;
            wa /= total;
            wb /= total;
          }
          // fp32 weights: e^x and the division within 4 ulps of the weight, the lse within 2
          // ulps of |top| plus log's error.
          const double got_lse = lse.value(lse_row);
          if (ref_lse == -kInf ? got_lse != -kInf
                               : !(std::fabs(got_lse - ref_lse) <= 3e-7 * std::fabs(top) + 3e-7)) {
            if (++failures <= 5)
              ADD_FAILURE() << what << " lse row " << lse_row << ": " << got_lse << " vs "
                            << ref_lse;
          }
          for (std::int64_t d = 0; d < shape.d; ++d) {
            const std::int64_t i = ((bi * shape.s + s) * shape.n + n) * shape.d + d;
            const double a = wa != 0 ? out_a.value(i) : 0.0, b = wb != 0 ? out_b.value(i) : 0.0;
            const double ref = wa * a + wb * b;
            const double bound = 1e-6 * (std::fabs(wa * a) + std::fabs(wb * b)) +
                                 storage_epsilon<O>() * std::fabs(ref);
            const double got = out.value(i);
            if (!(std::fabs(got - ref) <= bound)) {
              if (++failures <= 5)
                ADD_FAILURE() << what << " out " << i << ": " << got << " vs " << ref << " (bound "
                              << bound << ")";
            }
          }
        }
      }
    }
    EXPECT_EQ(failures, 0) << what;
  }
};

template <class A, class B, class O>
void sweep(const char* types) {
  std::mt19937 rng(7);
  for (const Shape shape : {Shape{1, 1, 1, 1}, Shape{2, 7, 3, 7}, Shape{1, 33, 2, 16},
                            Shape{2, 5, 4, 64}, Shape{1, 9, 3, 130}}) {
    for (const std::int64_t pad : {0, 5}) {
      for (const int threads : {1, 2}) {
        set_num_threads(threads);
        MergeCase<A, B, O> c(shape, pad);
        c.fill(rng);
        c.run();
        const std::string what = std::string(types) + " b" + std::to_string(shape.b) + " s" +
                                 std::to_string(shape.s) + " n" + std::to_string(shape.n) + " d" +
                                 std::to_string(shape.d) + " pad " + std::to_string(pad) +
                                 " threads " + std::to_string(threads) + " isa " +
                                 active_isa_name();
        c.check(what);
        EXPECT_EQ(c.out.damaged_canaries(), 0) << what;
        EXPECT_EQ(c.lse.damaged_canaries(), 0) << what;
      }
    }
  }
  set_num_threads(0);
}

TEST(MergeAttentionStates, MatchesFp64OnEveryDtypeCombination) {
  sweep<float, float, float>("f32+f32->f32");
  sweep<bf16, bf16, float>("bf16+bf16->f32");
  sweep<float, bf16, float>("f32+bf16->f32");
  sweep<f16, f16, f16>("f16+f16->f16");
  sweep<bf16, bf16, bf16>("bf16+bf16->bf16");
  sweep<float, f16, bf16>("f32+f16->bf16");
}

TEST(MergeAttentionStates, OneSideEmptyIsExactAndBothEmptyIsZero) {
  std::mt19937 rng(3);
  MergeCase<float, float, float> c({1, 6, 2, 19});
  c.fill(rng);
  c.run();
  for (std::int64_t row = 0; row < c.lse.size(); ++row) {
    const std::int64_t s = row % 6, n = row / 6;
    const float la = c.lse_a.at(row), lb = c.lse_b.at(row);
    if (la != -kInf && lb != -kInf) continue;
    EXPECT_TRUE(same_bits(c.lse.at(row), la == -kInf ? lb : la)) << "row " << row;
    for (std::int64_t d = 0; d < 19; ++d) {
      const std::int64_t i = (s * 2 + n) * 19 + d;
      const float expected = la == -kInf ? (lb == -kInf ? 0.f : c.out_b.at(i)) : c.out_a.at(i);
      EXPECT_TRUE(same_bits(c.out.at(i), expected)) << "row " << row << " d " << d;
    }
  }
}

TEST(MergeAttentionStates, NanOrInfiniteLseGivesNanRow) {
  MergeCase<float, float, float> c({1, 2, 1, 4});
  for (std::int64_t i = 0; i < 8; ++i) c.out_a.at(i) = c.out_b.at(i) = 1.f;
  c.lse_a.at(0) = std::numeric_limits<float>::quiet_NaN();
  c.lse_b.at(0) = 0.f;
  c.lse_a.at(1) = kInf;
  c.lse_b.at(1) = 0.f;
  c.run();
  for (std::int64_t i = 0; i < 8; ++i) EXPECT_TRUE(std::isnan(c.out.at(i))) << i;
}

TEST(MergeAttentionStates, InPlaceAndStridedEqualTheSeparateRun) {
  std::mt19937 rng(11);
  const Shape shape{2, 9, 3, 40};
  MergeCase<float, float, float> base(shape);
  base.fill(rng);
  base.run();
  // In place into out_a / lse_a.
  MergeCase<float, float, float> in_place(shape);
  for (std::int64_t i = 0; i < base.out_a.size(); ++i) {
    in_place.out_a.at(i) = base.out_a.at(i);
    in_place.out_b.at(i) = base.out_b.at(i);
  }
  for (std::int64_t i = 0; i < base.lse_a.size(); ++i) {
    in_place.lse_a.at(i) = base.lse_a.at(i);
    in_place.lse_b.at(i) = base.lse_b.at(i);
  }
  merge_attention_states(in_place.out_a.view(), in_place.lse_a.view(), in_place.out_b.view(),
                         in_place.lse_b.view(), in_place.out_a.view(), in_place.lse_a.view());
  for (std::int64_t i = 0; i < base.out.size(); ++i)
    ASSERT_TRUE(same_bits(in_place.out_a.at(i), base.out.at(i))) << "in place, element " << i;
  for (std::int64_t i = 0; i < base.lse.size(); ++i)
    ASSERT_TRUE(same_bits(in_place.lse_a.at(i), base.lse.at(i))) << "in place, lse " << i;
  // BNSD storage passed as its BSND view (strides permuted).
  TestTensor<float> a_bnsd({2, 3, 9, 40}), b_bnsd({2, 3, 9, 40}), out_bnsd({2, 3, 9, 40});
  // Calls f(BSND index, BNSD index) for every element of the shape.
  const auto each_element = [&](auto&& f) {
    for (std::int64_t bi = 0; bi < 2; ++bi)
      for (std::int64_t s = 0; s < 9; ++s)
        for (std::int64_t n = 0; n < 3; ++n)
          for (std::int64_t d = 0; d < 40; ++d)
            f(((bi * 9 + s) * 3 + n) * 40 + d, ((bi * 3 + n) * 9 + s) * 40 + d);
  };
  each_element([&](std::int64_t bsnd, std::int64_t bnsd) {
    a_bnsd.at(bnsd) = base.out_a.at(bsnd);
    b_bnsd.at(bnsd) = base.out_b.at(bsnd);
  });
  const auto as_bsnd = [](TensorView v) {
    std::swap(v.shape[1], v.shape[2]);
    std::swap(v.strides[1], v.strides[2]);
    return v;
  };
  TestTensor<float> lse({2, 3, 9});
  merge_attention_states(as_bsnd(a_bnsd.view()), base.lse_a.view(), as_bsnd(b_bnsd.view()),
                         base.lse_b.view(), as_bsnd(out_bnsd.view()), lse.view());
  each_element([&](std::int64_t bsnd, std::int64_t bnsd) {
    EXPECT_TRUE(same_bits(out_bnsd.at(bnsd), base.out.at(bsnd))) << "bnsd " << bnsd;
  });
}

// The merge's purpose: attention over keys [0, split) merged with attention over [split, Sk)
// is attention over all Sk keys. The halves and the whole come from the fp64 reference, stored
// as f32 (as a kernel would give them); the causal halves leave early rows empty on one side.
TEST(MergeAttentionStates, MergedKeyHalvesEqualAttentionOverAllKeys) {
  std::mt19937 rng(5);
  const std::int64_t batch = 2, sq = 13, sk = 29, heads = 3, dk = 24, dv = 20;
  std::vector<double> q(batch * sq * heads * dk), k(batch * sk * heads * dk),
      v(batch * sk * heads * dv);
  std::normal_distribution<double> normal(0.0, 1.0);
  for (auto* data : {&q, &k, &v})
    for (double& x : *data) x = normal(rng);
  for (const bool causal : {false, true}) {
    for (const std::int64_t split : {1, 11, 28}) {
      const auto problem = [&](std::int64_t first, std::int64_t count) {
        AttentionRefProblem p;
        p.batch = batch, p.q_len = sq, p.kv_len = sk, p.heads = p.kv_heads = heads;
        p.dk = dk, p.dv = dv, p.scale = 0.3;
        p.q = [&](auto b, auto s, auto h, auto d) {
          return q[((b * sq + s) * heads + h) * dk + d];
        };
        p.k = [&](auto b, auto s, auto h, auto d) {
          return k[((b * sk + s) * heads + h) * dk + d];
        };
        p.v = [&](auto b, auto s, auto h, auto d) {
          return v[((b * sk + s) * heads + h) * dv + d];
        };
        // Causal over the whole key range (bottom-right aligned), restricted to [first, +count).
        p.allowed = [=](auto, auto, auto i, auto j) {
          return j >= first && j < first + count && (!causal || j <= i + sk - sq);
        };
        return attention_reference(p);
      };
      const auto whole = problem(0, sk), left = problem(0, split),
                 right = problem(split, sk - split);
      const Shape shape{batch, sq, heads, dv};
      MergeCase<float, float, float> c(shape);
      for (std::int64_t i = 0; i < c.out_a.size(); ++i) {
        c.out_a.at(i) = static_cast<float>(left.out[i]);
        c.out_b.at(i) = static_cast<float>(right.out[i]);
      }
      for (std::int64_t i = 0; i < c.lse_a.size(); ++i) {
        c.lse_a.at(i) = static_cast<float>(left.lse[i]);
        c.lse_b.at(i) = static_cast<float>(right.lse[i]);
      }
      c.run();
      // Inputs rounded to f32 (2^-24 relative) and the fp32 weights: within 1e-6 of max |v|.
      for (std::int64_t i = 0; i < c.out.size(); ++i)
        ASSERT_NEAR(c.out.at(i), whole.out[i], 1e-6 * whole.magnitudes.v_max)
            << "causal " << causal << " split " << split << " element " << i;
      for (std::int64_t i = 0; i < c.lse.size(); ++i) {
        if (whole.lse[i] == -kInf) {
          ASSERT_EQ(c.lse.at(i), -kInf);
        } else {
          ASSERT_NEAR(c.lse.at(i), whole.lse[i], 1e-6 * (1 + std::fabs(whole.lse[i])))
              << "causal " << causal << " split " << split << " row " << i;
        }
      }
    }
  }
}

// Buffers as user allocators place them: the outputs at every offset within a cache line (f32:
// multiples of 4 bytes; bf16: of 2) equal the line-aligned run bit for bit, 2 threads, and
// nothing is written around them.
template <class T>
void expect_every_line_offset_equal() {
  set_num_threads(2);
  constexpr std::int64_t kS = 37, kN = 8, kD = 72;
  const auto count = static_cast<std::size_t>(kS * kN * kD);
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  std::vector<T> a0(count), b0(count);
  for (std::size_t i = 0; i < count; ++i) {
    a0[i] = from_float<T>(normal(rng));
    b0[i] = from_float<T>(normal(rng));
  }
  std::vector<float> lse_a(kS * kN), lse_b(kS * kN), lse(kS * kN);
  for (std::size_t i = 0; i < lse_a.size(); ++i) {
    lse_a[i] = 3 * normal(rng);
    lse_b[i] = i % 5 == 0 ? -kInf : 3 * normal(rng);
  }
  OffsetBuffer<T> a(count), b(count), out(count);
  std::vector<T> aligned(count);
  const auto run = [&](std::size_t offset) {
    T *pa = a.place(offset), *pb = b.place(offset), *po = out.place(offset);
    std::memcpy(pa, a0.data(), a.bytes());
    std::memcpy(pb, b0.data(), b.bytes());
    merge_attention_states(view(pa, {1, kS, kN, kD}), view(lse_a.data(), {1, kN, kS}),
                           view(pb, {1, kS, kN, kD}), view(lse_b.data(), {1, kN, kS}),
                           view(po, {1, kS, kN, kD}), view(lse.data(), {1, kN, kS}));
    EXPECT_TRUE(out.guards_intact()) << "offset " << offset;
    return po;
  };
  std::memcpy(aligned.data(), run(0), out.bytes());
  for (std::size_t offset = sizeof(T); offset < kLineBytes; offset += sizeof(T)) {
    EXPECT_EQ(std::memcmp(run(offset), aligned.data(), out.bytes()), 0)
        << dtype_name(detail::dtype_of<T>()) << ": buffers " << offset
        << " bytes past a line differ from the aligned run, isa " << active_isa_name();
  }
  set_num_threads(0);
}

TEST(MergeAttentionStates, EveryLineOffsetEqualsTheAlignedRun) {
  expect_every_line_offset_equal<float>();
  expect_every_line_offset_equal<bf16>();
}

TEST(MergeAttentionStates, RejectsBadInputsBeforeWriting) {
  const Shape shape{1, 4, 2, 8};
  MergeCase<float, float, float> c(shape);
  TestTensor<float> wrong_rank({4, 2, 8}), wrong_d({1, 4, 2, 9}), lse_wrong({1, 4, 2}),
      overlapping({1, 4, 2, 16});
  TestTensor<std::int8_t> int8_out(shape.out());
  TestTensor<bf16> lse_bf16(shape.lse());
  const auto merge = [&](TensorView a, TensorView la, TensorView b, TensorView lb, TensorView o,
                         TensorView l) {
    return [=] { merge_attention_states(a, la, b, lb, o, l); };
  };
  const auto A = c.out_a.view(), B = c.out_b.view(), O = c.out.view();
  const auto LA = c.lse_a.view(), LB = c.lse_b.view(), L = c.lse.view();
  expect_rejected(merge(wrong_rank.view(), LA, B, LB, O, L), "out_a", c.out);
  expect_rejected(merge(A, LA, wrong_d.view(), LB, O, L), "out_b", c.out);
  expect_rejected(merge(A, LA, B, LB, int8_out.view(), L), "out", int8_out);
  expect_rejected(merge(A, lse_bf16.view(), B, LB, O, L), "lse_a", c.out);
  expect_rejected(merge(A, LA, B, lse_wrong.view(), O, L), "lse_b", c.out);
  expect_rejected(merge(A, LA, B, LB, O, lse_wrong.view()), "lse", c.out);
  // Partial overlaps: out sharing memory with out_b shifted by a row, lse written over out_a.
  TensorView shifted = overlapping.view();
  shifted.shape[3] = 8;
  TensorView shifted_b = shifted;
  shifted_b.data = static_cast<float*>(shifted.data) + 8;
  expect_rejected(merge(A, LA, shifted_b, LB, shifted, L), "out", overlapping);
  TensorView lse_over_a = LA;
  lse_over_a.data = A.data;
  expect_rejected(merge(A, LA, B, LB, O, lse_over_a), "lse", c.out);
  TensorView null_out = O;
  null_out.data = nullptr;
  expect_rejected(merge(A, LA, B, LB, null_out, L), "out", c.out);
}

}  // namespace
}  // namespace ditops::test
