// block_sparse_attention, rainfusion_attention and attention_forward's sparse backend against
// the fp64 reference with the expanded token masks: tails (S not a multiple of the block), query
// blocks with no kept key, masks broadcast over heads and batches, GQA, both layouts, bf16/f16,
// 1 and 2 threads (ctest runs the binary once per ISA level); skipped blocks are never read;
// every class of bad input.

#include <cmath>
#include <ditops/attention.hpp>
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

/// q, k, v, out, lse of one self- or cross-attention problem and the reference's accessors.
template <class T>
struct Problem {
  std::int64_t b, sq, sk, n, nkv, d;
  bool head_first;
  TestTensor<T> q, k, v, out;
  TestTensor<float> lse;
  Problem(std::mt19937& rng, std::int64_t b_, std::int64_t sq_, std::int64_t sk_, std::int64_t n_,
          std::int64_t nkv_, std::int64_t d_, bool head_first_)
      : b(b_),
        sq(sq_),
        sk(sk_),
        n(n_),
        nkv(nkv_),
        d(d_),
        head_first(head_first_),
        q(attention_shape(head_first_, b_, sq_, n_, d_), 3),
        k(attention_shape(head_first_, b_, sk_, nkv_, d_), 1),
        v(attention_shape(head_first_, b_, sk_, nkv_, d_)),
        out(attention_shape(head_first_, b_, sq_, n_, d_), 2),
        lse({b_, n_, sq_}) {
    q.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
  }
  std::int64_t index(std::int64_t bi, std::int64_t s, std::int64_t h, std::int64_t di,
                     std::int64_t len, std::int64_t heads) const {
    return attention_index(head_first, bi, s, h, di, len, heads, d);
  }
  AttentionRefProblem reference(bool causal) {
    AttentionRefProblem p{b,      sq, sk, n,  nkv, d, d, 1.0 / std::sqrt(double(d)),
                          causal, {}, {}, {}, {},  {}};
    p.q = [this](auto bi, auto s, auto h, auto di) { return q.value(index(bi, s, h, di, sq, n)); };
    p.k = [this](auto bi, auto s, auto h, auto di) {
      return k.value(index(bi, s, h, di, sk, nkv));
    };
    p.v = [this](auto bi, auto s, auto h, auto di) {
      return v.value(index(bi, s, h, di, sk, nkv));
    };
    return p;
  }
  AttentionOptions options(bool causal = false) {
    AttentionOptions o;
    o.head_first = head_first;
    o.causal = causal;
    o.lse = lse.view();
    return o;
  }
  void expect_matches(const AttentionRefProblem& rp, const std::string& context) {
    const AttentionRefResult ref = attention_reference(rp);
    std::vector<double> expected(out.size());
    for (std::int64_t bi = 0; bi < b; ++bi) {
      for (std::int64_t s = 0; s < sq; ++s) {
        for (std::int64_t h = 0; h < n; ++h) {
          for (std::int64_t di = 0; di < d; ++di) {
            expected[index(bi, s, h, di, sq, n)] = ref.at(rp, bi, s, h, di);
          }
        }
      }
    }
    expect_close(out, expected, flash_tolerance<T>(), context);
    std::int64_t failures = 0;
    for (std::int64_t i = 0; i < lse.size(); ++i) {
      const double want = ref.lse[i], got = lse.value(i);
      const bool ok = std::isinf(want) ? got == want : std::fabs(got - want) <= kLseTolerance;
      if (!ok && failures++ == 0) {
        ADD_FAILURE() << context << ": lse[" << i << "] = " << got << ", expected " << want;
      }
    }
  }
};

struct BlockCase {
  std::int64_t b, sq, sk, n, nkv, d;
  int block_size;
  int mask_rank;  ///< 3: [N|1, ...]; 4: [B|1, N|1, ...]
  bool mask_per_head;
  bool causal, head_first;
  int threads;
  std::string describe() const {
    return "b" + std::to_string(b) + " sq" + std::to_string(sq) + " sk" + std::to_string(sk) +
           " n" + std::to_string(n) + "/" + std::to_string(nkv) + " d" + std::to_string(d) +
           " block " + std::to_string(block_size) + " rank " + std::to_string(mask_rank) +
           (mask_per_head ? " per-head" : " broadcast") + (causal ? " causal" : "") +
           (head_first ? " bnsd" : " bsnd") + " threads " + std::to_string(threads) + " isa " +
           active_isa_name();
  }
};

template <class T>
void run_block_case(const BlockCase& c, std::mt19937& rng) {
  set_num_threads(c.threads);
  Problem<T> pr(rng, c.b, c.sq, c.sk, c.n, c.nkv, c.d, c.head_first);
  const std::int64_t qb = (c.sq + c.block_size - 1) / c.block_size;
  const std::int64_t kb = (c.sk + c.block_size - 1) / c.block_size;
  const std::int64_t mb = c.mask_rank == 4 ? c.b : 1, mh = c.mask_per_head ? c.n : 1;
  std::vector<std::int64_t> shape = {mh, qb, kb};
  if (c.mask_rank == 4) shape.insert(shape.begin(), mb);
  TestTensor<std::uint8_t> mask(shape);
  std::bernoulli_distribution keep(0.4);
  for (std::int64_t i = 0; i < mask.size(); ++i) mask.at(i) = keep(rng);
  // Query block 0 of the first mask slice keeps nothing: its rows must be 0 with lse -inf.
  for (std::int64_t j = 0; j < kb; ++j) mask.at(j) = 0;
  auto kept = [&](std::int64_t bi, std::int64_t h, std::int64_t i, std::int64_t j) {
    const std::int64_t slice = (mb == 1 ? 0 : bi) * mh + (mh == 1 ? 0 : h);
    return mask.at((slice * qb + i / c.block_size) * kb + j / c.block_size) != 0;
  };
  AttentionRefProblem rp = pr.reference(c.causal);
  rp.allowed = kept;
  block_sparse_attention(pr.q.view(), pr.k.view(), pr.v.view(), as_bool(mask.view()), c.block_size,
                         pr.out.view(), pr.options(c.causal));
  pr.expect_matches(rp, c.describe());
}

TEST(BlockSparseAttention, MatchesTheReferenceWithTheExpandedMask) {
  std::mt19937 rng(71);
  const std::vector<BlockCase> cases = {
      {1, 200, 333, 2, 2, 64, 64, 3, true, false, false, 1},
      {2, 130, 130, 4, 2, 32, 128, 4, true, false, true, 2},
      {2, 257, 190, 4, 1, 48, 64, 4, false, false, false, 2},
      {1, 300, 300, 3, 3, 64, 128, 3, false, true, false, 1},
      {2, 64, 700, 2, 1, 128, 64, 3, true, false, true, 2},
      {1, 1, 129, 2, 2, 16, 64, 3, true, false, false, 1},
  };
  for (const BlockCase& c : cases) run_block_case<float>(c, rng);
  run_block_case<bf16>(cases[1], rng);
  run_block_case<f16>(cases[2], rng);
}

TEST(BlockSparseAttention, NeverReadsASkippedBlock) {
  // NaN in every key and value of the blocks head 0 skips: any read of them would reach the
  // output (a NaN score, or 0 * NaN in P·V).
  set_num_threads(2);
  std::mt19937 rng(72);
  Problem<float> pr(rng, 1, 256, 384, 2, 2, 64, false);
  TestTensor<std::uint8_t> mask({2, 4, 6});
  for (std::int64_t i = 0; i < mask.size(); ++i) mask.at(i) = 1;
  for (std::int64_t i = 0; i < 4; ++i) mask.at(i * 6 + 3) = mask.at(i * 6 + 5) = 0;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (std::int64_t key = 0; key < 384; ++key) {
    if (key / 64 != 3 && key / 64 != 5) continue;
    for (std::int64_t di = 0; di < 64; ++di) {
      pr.k.at(pr.index(0, key, 0, di, 384, 2)) = nan;
      pr.v.at(pr.index(0, key, 0, di, 384, 2)) = nan;
    }
  }
  block_sparse_attention(pr.q.view(), pr.k.view(), pr.v.view(), as_bool(mask.view()), 64,
                         pr.out.view(), pr.options());
  for (std::int64_t s = 0; s < 256; ++s) {
    for (std::int64_t di = 0; di < 64; ++di) {
      ASSERT_TRUE(std::isfinite(pr.out.at(pr.index(0, s, 0, di, 256, 2)))) << s << " " << di;
    }
  }
}

/// Fills a bool [S, S] tensor with rainfusion_mask and returns it.
TestTensor<std::uint8_t> token_mask(HeadPattern pattern, const RainFusionOptions& rf,
                                    std::int64_t tokens) {
  TestTensor<std::uint8_t> mask({tokens, tokens});
  rainfusion_mask(pattern, rf, as_bool(mask.view()));
  return mask;
}

struct RainCase {
  VideoLayout video;
  bool dense_first_frame;
  float sparsity;
  std::int64_t b, n, nkv, d;
  bool head_first;
  int threads;
  std::string describe() const {
    return std::to_string(video.frames) + "x" + std::to_string(video.height) + "x" +
           std::to_string(video.width) + " + " + std::to_string(video.text_tokens) +
           (video.text_first ? " text first" : " text last") +
           (dense_first_frame ? "" : " sparse frame 0") + " sparsity " + std::to_string(sparsity) +
           " n" + std::to_string(n) + "/" + std::to_string(nkv) + (head_first ? " bnsd" : " bsnd") +
           " threads " + std::to_string(threads) + " isa " + active_isa_name();
  }
};

template <class T>
void run_rain_case(const RainCase& c, std::mt19937& rng) {
  set_num_threads(c.threads);
  RainFusionOptions rf;
  rf.video = c.video;
  rf.dense_first_frame = c.dense_first_frame;
  rf.sparsity = c.sparsity;
  const std::int64_t S = c.video.text_tokens + c.video.frames * c.video.height * c.video.width;
  Problem<T> pr(rng, c.b, S, S, c.n, c.nkv, c.d, c.head_first);
  const HeadPattern cycle[] = {HeadPattern::spatial, HeadPattern::temporal, HeadPattern::textural,
                               HeadPattern::dense};
  std::vector<HeadPattern> patterns(c.b * c.n);
  for (std::size_t i = 0; i < patterns.size(); ++i) patterns[i] = cycle[(i * 5 + 1) % 4];
  std::vector<TestTensor<std::uint8_t>> masks;
  for (HeadPattern pattern : cycle) masks.push_back(token_mask(pattern, rf, S));
  AttentionRefProblem rp = pr.reference(false);
  rp.allowed = [&](auto bi, auto h, auto i, auto j) {
    const auto pattern = patterns[bi * c.n + h];
    const int which = pattern == HeadPattern::spatial    ? 0
                      : pattern == HeadPattern::temporal ? 1
                      : pattern == HeadPattern::textural ? 2
                                                         : 3;
    return masks[which].at(i * S + j) != 0;
  };
  rainfusion_attention(pr.q.view(), pr.k.view(), pr.v.view(), patterns, pr.out.view(), rf,
                       pr.options());
  pr.expect_matches(rp, c.describe());
}

TEST(RainFusionAttention, MatchesTheReferenceWithEachHeadsTokenMask) {
  std::mt19937 rng(73);
  const std::vector<RainCase> cases = {
      {{4, 6, 10, 37, true}, true, 0.75f, 1, 4, 2, 64, false, 1},
      {{5, 7, 9, 20, false}, true, 0.5f, 2, 4, 4, 32, true, 2},
      {{3, 8, 8, 0, true}, false, 0.6f, 1, 4, 1, 64, false, 2},
      {{1, 9, 11, 13, true}, true, 0.9f, 1, 4, 2, 48, false, 1},
      {{6, 5, 13, 64, true}, true, 0.9f, 1, 4, 2, 64, false, 2},
  };
  for (const RainCase& c : cases) run_rain_case<float>(c, rng);
  run_rain_case<bf16>(cases[0], rng);
  run_rain_case<f16>(cases[1], rng);
}

TEST(SparseBackend, EqualsFlashOnMaskedInputs) {
  std::mt19937 rng(74);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    Problem<float> pr(rng, 2, 300, 400, 4, 2, 64, false);
    // Block-structured mask with token-level edges: a band plus key padding per batch.
    TestTensor<std::uint8_t> mask({2, 1, 300, 400});
    for (std::int64_t bi = 0; bi < 2; ++bi) {
      for (std::int64_t i = 0; i < 300; ++i) {
        for (std::int64_t j = 0; j < 400; ++j) {
          mask.at((bi * 300 + i) * 400 + j) = std::abs(i - j) < 90 && j < 350 + bi * 20;
        }
      }
    }
    AttentionOptions options = pr.options();
    options.attn_mask = as_bool(mask.view());
    options.backend = AttentionBackend::flash;
    attention_forward(pr.q.view(), pr.k.view(), pr.v.view(), pr.out.view(), options);
    std::vector<double> flash(pr.out.size()), flash_lse(pr.lse.size());
    for (std::int64_t i = 0; i < pr.out.size(); ++i) flash[i] = pr.out.value(i);
    for (std::int64_t i = 0; i < pr.lse.size(); ++i) flash_lse[i] = pr.lse.value(i);
    options.backend = AttentionBackend::sparse;
    attention_forward(pr.q.view(), pr.k.view(), pr.v.view(), pr.out.view(), options);
    // The same kernel over the same blocks in the same order: equal up to the row grouping.
    expect_close(pr.out, flash, Tolerance{1e-6, 1e-7}, "threads " + std::to_string(threads));
    for (std::int64_t i = 0; i < pr.lse.size(); ++i) {
      ASSERT_NEAR(pr.lse.value(i), flash_lse[i], 1e-5) << i;
    }
    // Forced with a boolean mask, sparse serves the call instead of being refused with a
    // warning (as it is without a mask: tuner_test).
    const AttentionChoice choice = select_attention(pr.q.view(), pr.k.view(), pr.v.view(), options);
    EXPECT_EQ(choice.backend, AttentionBackend::sparse) << choice.detail;
    EXPECT_NE(choice.detail.find("forced"), std::string::npos) << choice.detail;
  }
}

TEST(BlockSparseAttention, RejectsBadInputsBeforeWriting) {
  std::mt19937 rng(75);
  Problem<float> pr(rng, 1, 100, 100, 2, 2, 32, false);
  TestTensor<std::uint8_t> mask({2, 2, 2}), wrong({2, 2, 3}), mask4({3, 2, 2, 2});
  TestTensor<float> float_mask({2, 2, 2});
  auto call = [&](TensorView m, int block) {
    return [&, m, block] {
      block_sparse_attention(pr.q.view(), pr.k.view(), pr.v.view(), m, block, pr.out.view());
    };
  };
  expect_rejected(call(as_bool(mask.view()), 32), "block_size", pr.out);
  expect_rejected(call(as_bool(wrong.view()), 64), "block_mask", pr.out);
  expect_rejected(call(as_bool(mask4.view()), 64), "block_mask", pr.out);
  expect_rejected(call(float_mask.view(), 64), "block_mask", pr.out);
  expect_rejected(call(as_bool(mask.view()), 128), "block_mask", pr.out);  // [.., 1, 1] wanted
  TensorView aliased = as_bool(pr.out.view());  // the mask overlaps the output
  aliased.rank = 3;
  aliased.shape[0] = 2;
  aliased.shape[1] = 2;
  aliased.shape[2] = 2;
  aliased.strides[0] = 4;
  aliased.strides[1] = 2;
  aliased.strides[2] = 1;
  expect_rejected(call(aliased, 64), "block_mask", pr.out);
}

TEST(RainFusionAttention, RejectsBadInputsBeforeWriting) {
  std::mt19937 rng(76);
  RainFusionOptions rf;
  rf.video = {2, 4, 5, 10, true};  // S = 50
  Problem<float> pr(rng, 1, 50, 50, 2, 2, 32, false);
  std::vector<HeadPattern> patterns(2, HeadPattern::spatial);
  auto call = [&](std::vector<HeadPattern> heads, RainFusionOptions options,
                  AttentionOptions attention = {}) {
    return [&pr, heads, options, attention] {
      rainfusion_attention(pr.q.view(), pr.k.view(), pr.v.view(), heads, pr.out.view(), options,
                           attention);
    };
  };
  expect_rejected(call({HeadPattern::spatial}, rf), "patterns", pr.out);
  expect_rejected(call({HeadPattern::spatial, static_cast<HeadPattern>(9)}, rf), "pattern", pr.out);
  RainFusionOptions bad = rf;
  bad.video.frames = 3;  // S = 70 != 50
  expect_rejected(call(patterns, bad), "rf.video", pr.out);
  bad = rf;
  bad.sparsity = 1.f;
  expect_rejected(call(patterns, bad), "rf.sparsity", pr.out);
  bad = rf;
  bad.textural_stride = 0;
  expect_rejected(call(patterns, bad), "rf.textural_stride", pr.out);
  bad = rf;
  bad.video.width = 0;
  expect_rejected(call(patterns, bad), "rf.video", pr.out);
  AttentionOptions causal;
  causal.causal = true;
  expect_rejected(call(patterns, rf, causal), "options.causal", pr.out);
  TestTensor<std::uint8_t> mask({50, 50});
  AttentionOptions masked;
  masked.attn_mask = as_bool(mask.view());
  expect_rejected(call(patterns, rf, masked), "options.attn_mask", pr.out);
}

}  // namespace
}  // namespace ditops::test
