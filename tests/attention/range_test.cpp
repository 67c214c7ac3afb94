// The value ranges every attention backend computes alike: softmax scales up to 2^16 (larger ones
// overflowed the scores: scale FLT_MAX gave zeros and lse -inf on flash and int8, NaN on the
// reference, MLA NaN from 1e37) and additive masks up to 2^126, with elements below -2^126
// excluding their key like -inf (+inf gave NaN, v[key] or 0 by backend; -FLT_MAX zeros on flash
// and the mean of V on the reference). Out-of-range values are an Error naming the call, the
// argument and the value on every entry and backend, before any output is written.

#include <cfloat>
#include <cmath>
#include <ditops/attention.hpp>
#include <ditops/mla.hpp>
#include <ditops/runtime.hpp>
#include <ditops/sparse.hpp>
#include <limits>
#include <random>
#include <vector>

#include "tests/reference/attention_ref.hpp"
#include "tests/support/expect_rejected.hpp"
#include "tests/support/tolerance.hpp"

namespace ditops::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr AttentionBackend kDenseBackends[] = {AttentionBackend::reference, AttentionBackend::flash,
                                               AttentionBackend::flash_bf16, AttentionBackend::int8,
                                               AttentionBackend::automatic};

// int8 is lossy (tests/attention/int8_test.cpp): on these 16-key rows its per-row error stays
// below a few percent of |v| ~ 1, where the defects this file guards against are O(1) (a
// masked row's zeros against the mean of V, NaN, one key's value).
constexpr Tolerance kInt8Loose{5e-2, 5e-2};

Tolerance tolerance_of(AttentionBackend backend, const AttentionRefResult& ref) {
  return backend == AttentionBackend::int8 ? kInt8Loose
                                           : attention_tolerance<float>(backend, ref.magnitudes);
}

/// q [1, 3, 2, 32], k/v [1, 16, 1, 32] f32 (BSND, GQA 2:1), small normal values.
struct Dense {
  TestTensor<float> q{{1, 3, 2, 32}}, k{{1, 16, 1, 32}}, v{{1, 16, 1, 32}}, out{{1, 3, 2, 32}},
      lse{{1, 2, 3}};
  explicit Dense(float q_scale = 1.f) {
    std::mt19937 rng(7);
    q.fill_normal(rng, 0.f, q_scale);
    k.fill_normal(rng);
    v.fill_normal(rng);
  }
  void run(AttentionOptions options) {
    options.lse = lse.view();
    attention_forward(q.view(), k.view(), v.view(), out.view(), options);
  }
  /// The fp64 oracle with `scale` and the additive `mask` [3, 16] (or none).
  AttentionRefResult reference(double scale, const TestTensor<float>* mask) const {
    AttentionRefProblem p{1, 3, 16, 2, 1, 32, 32, scale, false, {}, {}, {}, {}, {}};
    p.q = [&](auto, auto s, auto h, auto d) { return q.value((s * 2 + h) * 32 + d); };
    p.k = [&](auto, auto s, auto, auto d) { return k.value(s * 32 + d); };
    p.v = [&](auto, auto s, auto, auto d) { return v.value(s * 32 + d); };
    if (mask) {
      p.allowed = [mask](auto, auto, auto i, auto j) { return mask->at(i * 16 + j) != -kInf; };
      p.bias = [mask](auto, auto, auto i, auto j) { return double(mask->at(i * 16 + j)); };
    }
    return attention_reference(p);
  }
  void expect_matches(const AttentionRefResult& ref, AttentionBackend backend,
                      const std::string& what) {
    std::vector<double> expected(out.size());
    for (std::int64_t s = 0; s < 3; ++s) {
      for (std::int64_t h = 0; h < 2; ++h) {
        for (std::int64_t d = 0; d < 32; ++d) {
          expected[(s * 2 + h) * 32 + d] = ref.out[(s * 2 + h) * 32 + d];
        }
      }
    }
    const std::string context = what + " " + backend_name(backend) + " isa " + active_isa_name();
    expect_close(out, expected, tolerance_of(backend, ref), context);
    for (std::int64_t i = 0; i < lse.size(); ++i) {
      const double want = ref.lse[i], got = lse.value(i);
      if (std::isinf(want)) {
        EXPECT_EQ(got, want) << context << " lse " << i;
      } else {
        EXPECT_NEAR(got, want,
                    backend == AttentionBackend::int8
                        ? 5e-2
                        : attention_lse_tolerance(backend, ref.magnitudes))
            << context << " lse " << i;
      }
    }
  }
};

TEST(AttentionRange, ScalesAboveTwoToTheSixteenAreRejectedOnEveryBackend) {
  set_num_threads(1);
  Dense a;
  TestTensor<std::uint8_t> keep({3, 16});
  for (std::int64_t i = 0; i < keep.size(); ++i) keep.at(i) = 1;
  for (const float scale : {FLT_MAX, 2.3e38f, 1e37f, 65537.f, 1e5f}) {
    for (const AttentionBackend backend : kDenseBackends) {
      AttentionOptions options;
      options.scale = scale;
      options.backend = backend;
      expect_rejected([&] { a.run(options); }, "attention_forward: scale (", a.out);
      expect_rejected([&] { a.run(options); }, ") must be finite, > 0 and <= 65536", a.out);
    }
    AttentionOptions sparse;
    sparse.scale = scale;
    sparse.backend = AttentionBackend::sparse;
    sparse.attn_mask = as_bool(keep.view());
    expect_rejected([&] { a.run(sparse); }, "attention_forward: scale (", a.out);
  }
}

// At the limit every backend still agrees with the oracle: q is scaled down so that the scores
// are as large as with the default 1/sqrt(Dk) (unit variance), so the scale's size is not what
// decides the result (int8's error grows with the scores' spread).
TEST(AttentionRange, ScaleAtTheLimitMatchesTheOracleOnEveryBackend) {
  set_num_threads(2);
  Dense a(1.f / (65536.f * std::sqrt(32.f)));
  const AttentionRefResult ref = a.reference(65536.0, nullptr);
  for (const AttentionBackend backend : kDenseBackends) {
    AttentionOptions options;
    options.scale = 65536.f;
    options.backend = backend;
    a.run(options);
    a.expect_matches(ref, backend, "scale 65536");
  }
}

TEST(AttentionRange, VarlenSparseAndMlaRejectScalesAboveTheLimit) {
  set_num_threads(1);
  TestTensor<float> q({8, 2, 32}), k({8, 1, 32}), v({8, 1, 32}), out({8, 2, 32});
  const std::vector<std::int32_t> cu = {0, 3, 8};
  VarlenOptions varlen;
  varlen.scale = FLT_MAX;
  expect_rejected(
      [&] { attention_forward_varlen(q.view(), k.view(), v.view(), cu, cu, out.view(), varlen); },
      "attention_forward_varlen: scale (3.40282e+38) must be finite, > 0 and <= 65536", out);

  // RainFusion over 2 frames of 2 x 2 tokens (S = 8), block-sparse over one 64-block.
  TestTensor<float> qs({1, 8, 2, 32}), ks({1, 8, 2, 32}), outs({1, 8, 2, 32});
  TestTensor<std::uint8_t> blocks({1, 1, 1, 1}), block_out({1, 2, 1, 1});
  blocks.at(0) = 1;
  RainFusionOptions rf;
  rf.video = {2, 2, 2, 0, true};
  AttentionOptions options;
  options.scale = 1e37f;
  const std::string message = "scale (1e+37) must be finite, > 0 and <= 65536";
  expect_rejected(
      [&] { rainfusion_attention(qs.view(), ks.view(), ks.view(), {}, outs.view(), rf, options); },
      "rainfusion_attention: " + message, outs);
  expect_rejected([&] { rainfusion_classify(qs.view(), ks.view(), rf, options); },
                  "rainfusion_classify: " + message, outs);
  expect_rejected(
      [&] {
        rainfusion_adaptive_blocks(qs.view(), ks.view(), rf, 64, as_bool(block_out.view()),
                                   options);
      },
      "rainfusion_adaptive_blocks: " + message, block_out);
  expect_rejected(
      [&] {
        block_sparse_attention(qs.view(), ks.view(), ks.view(), as_bool(blocks.view()), 64,
                               outs.view(), options);
      },
      "block_sparse_attention: " + message, outs);

  // MLA decode of one token.
  TestTensor<float> q_nope({1, 1, kMlaNopeDim}), q_rope({1, 1, kMlaRopeDim}),
      out_mla({1, 1, kMlaNopeDim});
  TestTensor<std::int8_t> nope({1, 64, kMlaNopeDim});
  TestTensor<float> nope_scale({1, 64, 1}), rope({1, 64, kMlaRopeDim});
  TestTensor<std::int32_t> table({1, 1});
  const std::vector<std::int32_t> seq_lens = {1};
  MlaDecodeOptions mla;
  mla.scale = 1e37f;
  expect_rejected(
      [&] {
        mla_decode_paged(q_nope.view(), q_rope.view(),
                         {nope.view(), nope_scale.view(), rope.view()}, table.view(), seq_lens,
                         out_mla.view(), mla);
      },
      "mla_decode_paged: options.scale (1e+37) must be finite, > 0 and <= 65536", out_mla);
}

TEST(AttentionRange, PlusInfinityInAnAdditiveMaskIsAnErrorNamingTheElement) {
  set_num_threads(1);
  Dense a;
  TestTensor<float> mask({1, 2, 3, 16});
  mask.at((1 * 3 + 2) * 16 + 5) = kInf;
  for (const AttentionBackend backend : kDenseBackends) {
    AttentionOptions options;
    options.backend = backend;
    options.attn_mask = mask.view();
    expect_rejected([&] { a.run(options); }, "attention_forward: attn_mask[0, 1, 2, 5] (inf)",
                    a.out);
  }
  mask.at((1 * 3 + 2) * 16 + 5) = 0x1p127f;  // finite, but beyond the range
  AttentionOptions options;
  options.attn_mask = mask.view();
  expect_rejected([&] { a.run(options); }, "is above 2^126", a.out);
  TestTensor<std::uint8_t> blocks({1, 1, 1, 1});
  blocks.at(0) = 1;
  expect_rejected(
      [&] {
        block_sparse_attention(a.q.view(), a.k.view(), a.v.view(), as_bool(blocks.view()), 64,
                               a.out.view(), options);
      },
      "block_sparse_attention: attn_mask[0, 1, 2, 5]", a.out);
  // A broadcast rank-2 mask names its own indices.
  TestTensor<float> rank2({3, 16});
  rank2.at(16 + 15) = kInf;
  options.attn_mask = rank2.view();
  expect_rejected([&] { a.run(options); }, "attn_mask[1, 15] (inf)", a.out);
}

// Row 0 fully masked with -FLT_MAX (torch.finfo(float32).min): no key attended, zeros and lse
// -inf on every backend; row 1 mixes -FLT_MAX, -2^126 and ordinary biases; row 2 holds the
// largest bias accepted (2^126) on one key, which then takes all the weight.
TEST(AttentionRange, MaskBelowMinusTwoToThe126ExcludesLikeMinusInfinityOnEveryBackend) {
  set_num_threads(2);
  Dense a;
  TestTensor<float> mask({3, 16});
  std::mt19937 rng(3);
  std::normal_distribution<float> bias(0.f, 1.f);
  for (std::int64_t j = 0; j < 16; ++j) {
    mask.at(j) = -FLT_MAX;
    mask.at(16 + j) = j % 3 == 0 ? -FLT_MAX : j % 3 == 1 ? -0x1p127f : bias(rng);
    mask.at(32 + j) = j == 9 ? 0x1p126f : bias(rng);
  }
  const AttentionRefResult ref = a.reference(1.0 / std::sqrt(32.0), &mask);
  ASSERT_EQ(ref.lse[0], -std::numeric_limits<double>::infinity());
  for (const AttentionBackend backend : kDenseBackends) {
    AttentionOptions options;
    options.backend = backend;
    options.attn_mask = mask.view();
    a.run(options);
    a.expect_matches(ref, backend, "-FLT_MAX mask");
  }
}

}  // namespace
}  // namespace ditops::test
