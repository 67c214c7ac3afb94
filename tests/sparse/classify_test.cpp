// rainfusion_classify on planted heads (attention within frames -> spatial, along (h, w) columns
// -> temporal, near-uniform -> textural) over several layouts, BSND and BNSD, f32 / bf16 / f16,
// GQA, more sampled rows than one GEMM chunk; repeatable and the same on 1 and 2 threads; the
// threshold order, options.scale, which queries are sampled, layouts without sparse tokens.
// rainfusion_adaptive_blocks on planted pooled scores (known top blocks, ties, a partial last
// block), forced text / frame-0 blocks, the kept count per row, both layouts, threads. Every class
// of bad input.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ditops/runtime.hpp>
#include <ditops/sparse.hpp>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/reference/attention_ref.hpp"
#include "tests/support/expect_rejected.hpp"

namespace ditops::test {
namespace {

RainFusionOptions options_of(std::int64_t frames, std::int64_t height, std::int64_t width,
                             std::int64_t text, bool text_first, bool dense_first_frame,
                             float sparsity) {
  RainFusionOptions rf;
  rf.video = {frames, height, width, text, text_first};
  rf.dense_first_frame = dense_first_frame;
  rf.sparsity = sparsity;
  return rf;
}

std::int64_t tokens_of(const RainFusionOptions& rf) {
  return rf.video.text_tokens + rf.video.frames * rf.video.height * rf.video.width;
}

std::string describe(const RainFusionOptions& rf) {
  const VideoLayout& v = rf.video;
  return std::to_string(v.text_tokens) + " text " + (v.text_first ? "first" : "last") + " + " +
         std::to_string(v.frames) + " x " + std::to_string(v.height) + " x " +
         std::to_string(v.width) + (rf.dense_first_frame ? " dense frame 0" : "") + " sparsity " +
         std::to_string(rf.sparsity);
}

/// q [B, S, N, D] and k [B, S, Nkv, D] (or BNSD) holding the same logical values in either
/// layout: values are generated in logical order, then stored.
template <class T>
struct QK {
  std::int64_t b, s, n, nkv, d;
  bool head_first;
  TestTensor<T> q, k;
  QK(std::int64_t b_, std::int64_t s_, std::int64_t n_, std::int64_t nkv_, std::int64_t d_,
     bool head_first_)
      : b(b_),
        s(s_),
        n(n_),
        nkv(nkv_),
        d(d_),
        head_first(head_first_),
        q(attention_shape(head_first_, b_, s_, n_, d_), 2),
        k(attention_shape(head_first_, b_, s_, nkv_, d_), 1) {}
  void set_q(std::int64_t batch, std::int64_t token, std::int64_t head, std::int64_t dim,
             double value) {
    q.at(attention_index(head_first, batch, token, head, dim, s, n, d)) =
        from_float<T>(static_cast<float>(value));
  }
  void set_k(std::int64_t batch, std::int64_t token, std::int64_t head, std::int64_t dim,
             double value) {
    k.at(attention_index(head_first, batch, token, head, dim, s, nkv, d)) =
        from_float<T>(static_cast<float>(value));
  }
  double get_q(std::int64_t batch, std::int64_t token, std::int64_t head, std::int64_t dim) const {
    return q.value(attention_index(head_first, batch, token, head, dim, s, n, d));
  }
  double get_k(std::int64_t batch, std::int64_t token, std::int64_t head, std::int64_t dim) const {
    return k.value(attention_index(head_first, batch, token, head, dim, s, nkv, d));
  }
  AttentionOptions options() const {
    AttentionOptions o;
    o.head_first = head_first;
    return o;
  }
};

/// Video token (t, h, w) of token index `token`, or t = -1 for text.
struct Where {
  std::int64_t t = -1, h = 0, w = 0;
};
Where where(const RainFusionOptions& rf, std::int64_t token) {
  const VideoLayout& v = rf.video;
  const std::int64_t video = v.text_first ? token - v.text_tokens : token;
  if (video < 0 || video >= v.frames * v.height * v.width) return {};
  return {video / (v.height * v.width), video / v.width % v.height, video % v.width};
}

/// Planted heads, B = 2: query head n is of type n % 3 and reads KV head g = n / (N / Nkv).
/// KV head g's key of a video token at (t, h, w) is alpha (e_t + u_hw) + noise, with e_t
/// one-hot in dimensions [g T, (g + 1) T) and u_hw a random unit vector (drawn per KV head) in
/// the dimensions past Nkv T. Type 0's query is alpha e_t (its softmax lives in its frame:
/// spatial), type 1's alpha u_hw (its (h, w) column across frames: temporal), type 2's small
/// noise (near-uniform: textural). Text tokens are noise. alpha^2 times the softmax scale is
/// `sharpness` (24: outside its frame / column a planted row keeps ~1e-6 of its mass). A head
/// reading the wrong KV head sees another frame embedding and other column vectors.
template <class T>
QK<T> planted(const RainFusionOptions& rf, std::int64_t heads, std::int64_t kv_heads,
              std::int64_t dim, bool head_first, unsigned seed, double sharpness = 24) {
  const std::int64_t S = tokens_of(rf), frames = rf.video.frames;
  const std::int64_t columns = rf.video.height * rf.video.width, group = heads / kv_heads;
  const std::int64_t first_column_dim = kv_heads * frames;
  QK<T> x(2, S, heads, kv_heads, dim, head_first);
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> unit(static_cast<std::size_t>(kv_heads * columns * dim), 0.0);
  for (std::int64_t c = 0; c < kv_heads * columns; ++c) {
    double norm = 0;
    for (std::int64_t d = first_column_dim; d < dim; ++d) {
      unit[c * dim + d] = normal(rng);
      norm += unit[c * dim + d] * unit[c * dim + d];
    }
    for (std::int64_t d = first_column_dim; d < dim; ++d) unit[c * dim + d] /= std::sqrt(norm);
  }
  const double alpha = std::sqrt(sharpness * std::sqrt(static_cast<double>(dim)));
  constexpr double kNoise = 0.05;
  for (std::int64_t b = 0; b < 2; ++b) {
    for (std::int64_t s = 0; s < S; ++s) {
      const Where at = where(rf, s);
      const bool video = at.t >= 0;
      for (std::int64_t g = 0; g < kv_heads; ++g) {
        const double* u = unit.data() + (g * columns + at.h * rf.video.width + at.w) * dim;
        for (std::int64_t d = 0; d < dim; ++d) {
          const double frame_part = video && d == g * frames + at.t ? alpha : 0.0;
          const double column_part = video ? alpha * u[d] : 0.0;
          x.set_k(b, s, g, d, frame_part + column_part + kNoise * normal(rng));
          for (std::int64_t n = g * group; n < (g + 1) * group; ++n) {
            const double planted_part = n % 3 == 0 ? frame_part : n % 3 == 1 ? column_part : 0.0;
            x.set_q(b, s, n, d, planted_part + kNoise * normal(rng));
          }
        }
      }
    }
  }
  return x;
}

std::vector<HeadPattern> planted_patterns(std::int64_t heads) {
  const HeadPattern types[] = {HeadPattern::spatial, HeadPattern::temporal, HeadPattern::textural};
  std::vector<HeadPattern> patterns;
  for (std::int64_t b = 0; b < 2; ++b) {
    for (std::int64_t n = 0; n < heads; ++n) patterns.push_back(types[n % 3]);
  }
  return patterns;
}

std::string names(const std::vector<HeadPattern>& patterns) {
  std::string text;
  for (HeadPattern p : patterns) text += std::string(text.empty() ? "" : " ") + pattern_name(p);
  return text;
}

template <class T>
void check_planted(const RainFusionOptions& rf, std::int64_t heads, std::int64_t kv_heads,
                   std::int64_t dim, double sharpness = 24) {
  SCOPED_TRACE(describe(rf) + " heads " + std::to_string(heads) + "/" + std::to_string(kv_heads) +
               " d " + std::to_string(dim) + " dtype " + dtype_name(detail::dtype_of<T>()) +
               " sharpness " + std::to_string(sharpness));
  const int before = num_threads();
  std::vector<HeadPattern> first;
  for (bool head_first : {false, true}) {
    QK<T> x = planted<T>(rf, heads, kv_heads, dim, head_first, 42, sharpness);
    const auto q_before = x.q.snapshot(), k_before = x.k.snapshot();
    set_num_threads(1);
    const auto one = rainfusion_classify(x.q.view(), x.k.view(), rf, x.options());
    const auto again = rainfusion_classify(x.q.view(), x.k.view(), rf, x.options());
    set_num_threads(2);
    const auto two = rainfusion_classify(x.q.view(), x.k.view(), rf, x.options());
    EXPECT_EQ(names(one), names(planted_patterns(heads))) << (head_first ? "BNSD" : "BSND");
    EXPECT_EQ(one, again) << "repeated call differs";
    EXPECT_EQ(one, two) << "2 threads differ from 1";
    if (first.empty()) {
      first = one;
    } else {
      EXPECT_EQ(first, one) << "BNSD differs from BSND";
    }
    EXPECT_TRUE(x.q.unchanged_since(q_before) && x.k.unchanged_since(k_before)) << "inputs written";
  }
  set_num_threads(before);
}

TEST(RainFusionClassify, PlantedHeads) {
  // Text first, dense frame 0; 16 sampled rows.
  check_planted<float>(options_of(6, 8, 8, 16, true, true, 0.75f), 3, 3, 96);
  // Text last, odd extents, GQA: one KV head for three query heads, two or three KV heads for
  // six (a head reading another KV head's keys would be classified textural).
  check_planted<float>(options_of(7, 5, 9, 10, false, true, 0.6f), 3, 1, 96);
  check_planted<bf16>(options_of(7, 5, 9, 10, false, true, 0.6f), 3, 1, 96);
  check_planted<float>(options_of(7, 5, 9, 10, false, true, 0.6f), 6, 2, 96);
  check_planted<bf16>(options_of(6, 8, 8, 16, true, true, 0.75f), 6, 3, 96);
  // No text, frame 0 sparse like the others.
  check_planted<bf16>(options_of(8, 6, 7, 0, true, false, 0.8f), 3, 3, 80);
  check_planted<f16>(options_of(6, 8, 8, 16, true, true, 0.5f), 3, 3, 96);
  // Scaled scores of 120 (exp(120) overflows fp32): the softmax must subtract the row maximum.
  check_planted<float>(options_of(6, 8, 8, 16, true, true, 0.75f), 3, 3, 96, 120);
  // S = 7040: 35 sampled rows, more than one GEMM chunk of 32.
  check_planted<float>(options_of(8, 24, 36, 128, true, true, 0.75f), 3, 1, 64);
}

TEST(RainFusionClassify, ThresholdDecidesInOrder) {
  // With a threshold any positive recall reaches, every head is temporal (checked first).
  RainFusionOptions rf = options_of(6, 8, 8, 16, true, true, 0.75f);
  rf.recall_threshold = 1e-6f;
  QK<float> x = planted<float>(rf, 3, 3, 96, false, 7);
  EXPECT_EQ(names(rainfusion_classify(x.q.view(), x.k.view(), rf)),
            names(std::vector<HeadPattern>(6, HeadPattern::temporal)));
  // options.scale applies: scores scaled to almost nothing make every head near-uniform, whose
  // recalls (the masks' shares of the keys, ~0.4) miss 0.95.
  rf.recall_threshold = 0.95f;
  AttentionOptions tiny;
  tiny.scale = 1e-6f;
  EXPECT_EQ(names(rainfusion_classify(x.q.view(), x.k.view(), rf, tiny)),
            names(std::vector<HeadPattern>(6, HeadPattern::textural)));
  // ... and a threshold under the uniform spatial recall (16 + 64 + 64 of 400 keys = 0.36) but
  // over the uniform temporal one (16 + 64 + the 5-token column = 0.21) makes them spatial.
  rf.recall_threshold = 0.3f;
  EXPECT_EQ(names(rainfusion_classify(x.q.view(), x.k.view(), rf, tiny)),
            names(std::vector<HeadPattern>(6, HeadPattern::spatial)));
}

TEST(RainFusionClassify, SamplesOnlySparseVideoQueries) {
  // NaN queries on the text and (dense) frame-0 tokens leave the planted classes as they are:
  // those rows are never sampled. Without the dense frame 0, frame 0 is sampled like any frame,
  // and a NaN row makes the recalls NaN: textural everywhere.
  RainFusionOptions rf = options_of(6, 8, 8, 16, true, true, 0.75f);
  QK<float> x = planted<float>(rf, 3, 3, 96, false, 9);
  for (std::int64_t b = 0; b < 2; ++b) {
    for (std::int64_t s = 0; s < x.s; ++s) {
      if (where(rf, s).t > 0) continue;
      for (std::int64_t n = 0; n < 3; ++n) {
        for (std::int64_t d = 0; d < x.d; ++d) {
          x.set_q(b, s, n, d, std::numeric_limits<double>::quiet_NaN());
        }
      }
    }
  }
  EXPECT_EQ(names(rainfusion_classify(x.q.view(), x.k.view(), rf)), names(planted_patterns(3)));
  rf.dense_first_frame = false;
  EXPECT_EQ(names(rainfusion_classify(x.q.view(), x.k.view(), rf)),
            names(std::vector<HeadPattern>(6, HeadPattern::textural)));
}

TEST(RainFusionClassify, FewOrNoSparseTokens) {
  std::mt19937 rng(3);
  // One frame, dense: no sparse video query to sample: spatial everywhere.
  {
    const RainFusionOptions rf = options_of(1, 6, 6, 8, true, true, 0.5f);
    QK<float> x(2, tokens_of(rf), 3, 3, 32, false);
    x.q.fill_normal(rng);
    x.k.fill_normal(rng);
    EXPECT_EQ(names(rainfusion_classify(x.q.view(), x.k.view(), rf)),
              names(std::vector<HeadPattern>(6, HeadPattern::spatial)));
  }
  // Two frames of 2 x 2, dense frame 0: only 4 sparse tokens to sample. Near-uniform rows keep
  // everything under the spatial mask (text + frame 0 + own frame) and 8 of 11 keys under the
  // temporal one (r = 0: the floor is above 1 - sparsity): spatial.
  {
    const RainFusionOptions rf = options_of(2, 2, 2, 3, true, true, 0.64f);
    QK<float> x(2, tokens_of(rf), 3, 1, 32, true);
    x.q.fill_normal(rng, 0.f, 0.01f);
    x.k.fill_normal(rng, 0.f, 0.01f);
    AttentionOptions o = x.options();
    EXPECT_EQ(names(rainfusion_classify(x.q.view(), x.k.view(), rf, o)),
              names(std::vector<HeadPattern>(6, HeadPattern::spatial)));
  }
}

TEST(RainFusionClassify, RejectsBadInputs) {
  const RainFusionOptions rf = options_of(3, 4, 4, 5, true, true, 0.5f);
  const std::int64_t S = tokens_of(rf);
  std::mt19937 rng(5);
  auto expect_error = [](auto&& call, const std::string& needle) {
    try {
      call();
      ADD_FAILURE() << "no ditops::Error for: " << needle;
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_EQ(message.rfind("rainfusion_classify: ", 0), 0u) << message;
      EXPECT_NE(message.find(needle), std::string::npos) << message << " lacks " << needle;
    }
  };
  QK<float> good(1, S, 2, 1, 16, false);
  good.q.fill_normal(rng);
  good.k.fill_normal(rng);
  QK<float> short_q(1, S - 1, 2, 1, 16, false), long_k(1, S + 1, 2, 1, 16, true);
  expect_error([&] { rainfusion_classify(short_q.q.view(), good.k.view(), rf); }, "q.shape[1]");
  expect_error([&] { rainfusion_classify(short_q.q.view(), good.k.view(), rf); }, "rf.video");
  expect_error([&] { rainfusion_classify(good.q.view(), short_q.k.view(), rf); }, "k.shape[1]");
  QK<float> bnsd(1, S, 2, 1, 16, true);
  AttentionOptions head_first;
  head_first.head_first = true;
  expect_error([&] { rainfusion_classify(bnsd.q.view(), long_k.k.view(), rf, head_first); },
               "k.shape[2]");
  RainFusionOptions bad = rf;
  bad.sparsity = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { rainfusion_classify(good.q.view(), good.k.view(), bad); }, "rf.sparsity");
  bad = rf;
  bad.video.frames = 0;
  expect_error([&] { rainfusion_classify(good.q.view(), good.k.view(), bad); }, "rf.video");
  AttentionOptions causal;
  causal.causal = true;
  expect_error([&] { rainfusion_classify(good.q.view(), good.k.view(), rf, causal); },
               "options.causal");
  std::vector<std::uint8_t> mask_data(S * S, 1);
  AttentionOptions masked;
  masked.attn_mask = as_bool(view(mask_data.data(), {S, S}));
  expect_error([&] { rainfusion_classify(good.q.view(), good.k.view(), rf, masked); },
               "options.attn_mask");
  TensorView wrong = good.k.view();
  wrong.dtype = DType::bf16;
  expect_error([&] { rainfusion_classify(good.q.view(), wrong, rf); }, "k.dtype");
  wrong = good.q.view();
  wrong.dtype = DType::i32;
  expect_error([&] { rainfusion_classify(wrong, good.k.view(), rf); }, "q.dtype");
  QK<float> heads(1, S, 3, 2, 16, false);  // 3 heads over 2 KV heads
  expect_error([&] { rainfusion_classify(heads.q.view(), heads.k.view(), rf); }, "KV heads");
}

// ---- adaptive blocks
// -----------------------------------------------------------------------------

std::int64_t kept_blocks(double sparsity, std::int64_t blocks) {
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::ceil((1 - sparsity) * blocks)));
}

/// Block j is forced iff one of its tokens is text or (dense_first_frame) in frame 0.
std::vector<bool> forced_blocks(const RainFusionOptions& rf, std::int64_t block_size) {
  const std::int64_t S = tokens_of(rf), blocks = (S + block_size - 1) / block_size;
  std::vector<bool> forced(blocks, false);
  for (std::int64_t s = 0; s < S; ++s) {
    const Where at = where(rf, s);
    if (at.t < 0 || (rf.dense_first_frame && at.t == 0)) forced[s / block_size] = true;
  }
  return forced;
}

/// Runs rainfusion_adaptive_blocks into a padded [B, N, nb, nb] tensor; returns it flat.
template <class T>
std::vector<std::uint8_t> adaptive(QK<T>& x, const RainFusionOptions& rf, int block_size) {
  const std::int64_t blocks = (x.s + block_size - 1) / block_size;
  TestTensor<std::uint8_t> mask({x.b, x.n, blocks, blocks}, 3);
  for (std::int64_t i = 0; i < mask.size(); ++i) mask.at(i) = 9;
  rainfusion_adaptive_blocks(x.q.view(), x.k.view(), rf, block_size, as_bool(mask.view()),
                             x.options());
  EXPECT_EQ(mask.damaged_canaries(), 0);
  std::vector<std::uint8_t> flat(mask.size());
  for (std::int64_t i = 0; i < mask.size(); ++i) flat[i] = mask.at(i);
  return flat;
}

TEST(RainFusionAdaptiveBlocks, PlantedTopBlocks) {
  // 4 x 9 x 15 video, no text, no dense frame: 540 tokens, nine 64-token blocks, the last of
  // 28. Key block j's tokens hold A[b][d][j] in dimension d, query block i's of head n a one in
  // dimension (i + n) % 9: pooled score(i, j) = scale A[b][(i + n) % 9][j]. A's entries are
  // small integers (ties everywhere) and, in half the rows, the partial last block is the strict
  // maximum: a sum over 64 instead of a mean over 28 would drop it.
  const RainFusionOptions base = options_of(4, 9, 15, 0, true, false, 0.5f);
  constexpr std::int64_t kBlocks = 9, kDim = 16;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> value(0, 3);
  std::vector<double> A(2 * kDim * kBlocks, 0.0);
  for (std::int64_t b = 0; b < 2; ++b) {
    for (std::int64_t d = 0; d < kBlocks; ++d) {
      for (std::int64_t j = 0; j < kBlocks; ++j) {
        A[(b * kDim + d) * kBlocks + j] = j == kBlocks - 1 && d % 2 == 0 ? 5.0 : value(rng);
      }
    }
  }
  for (float sparsity : {0.5f, 0.75f, 0.f}) {
    RainFusionOptions rf = base;
    rf.sparsity = sparsity;
    const std::int64_t keep = kept_blocks(sparsity, kBlocks);
    std::vector<std::uint8_t> first;
    for (bool head_first : {false, true}) {
      QK<bf16> x(2, 540, 2, 1, kDim, head_first);
      for (std::int64_t b = 0; b < 2; ++b) {
        for (std::int64_t s = 0; s < 540; ++s) {
          for (std::int64_t d = 0; d < kDim; ++d) {
            x.set_k(b, s, 0, d, d < kBlocks ? A[(b * kDim + d) * kBlocks + s / 64] : 0.0);
            for (std::int64_t n = 0; n < 2; ++n) {
              x.set_q(b, s, n, d, d == (s / 64 + n) % kBlocks ? 1.0 : 0.0);
            }
          }
        }
      }
      const auto mask = adaptive(x, rf, 64);
      for (std::int64_t b = 0; b < 2; ++b) {
        for (std::int64_t n = 0; n < 2; ++n) {
          for (std::int64_t i = 0; i < kBlocks; ++i) {
            const double* row = &A[(b * kDim + (i + n) % kBlocks) * kBlocks];
            std::vector<std::int64_t> order(kBlocks);
            for (std::int64_t j = 0; j < kBlocks; ++j) order[j] = j;
            std::stable_sort(order.begin(), order.end(),
                             [&](std::int64_t a, std::int64_t c) { return row[a] > row[c]; });
            std::string want(kBlocks, '0'), got(kBlocks, '0');
            for (std::int64_t r = 0; r < keep; ++r) want[order[r]] = '1';
            for (std::int64_t j = 0; j < kBlocks; ++j) {
              got[j] = mask[((b * 2 + n) * kBlocks + i) * kBlocks + j] ? '1' : '0';
            }
            EXPECT_EQ(got, want) << "sparsity " << sparsity << " b " << b << " n " << n
                                 << " query block " << i << (head_first ? " BNSD" : " BSND");
          }
        }
      }
      if (first.empty()) {
        first = mask;
      } else {
        EXPECT_EQ(first, mask) << "BNSD differs from BSND";
      }
    }
  }
}

TEST(RainFusionAdaptiveBlocks, KeptCountRoundsTheDecimalSparsity) {
  // 25 blocks: 0.64f (0.63999998...) keeps ceil(0.36 x 25) = 9, not 10; 0.6f keeps 10.
  const RainFusionOptions base = options_of(4, 20, 20, 0, true, false, 0.64f);
  std::mt19937 rng(13);
  QK<float> x(1, 1600, 2, 2, 8, false);
  x.q.fill_normal(rng);
  x.k.fill_normal(rng);
  for (auto [sparsity, want] : {std::pair<float, int>{0.64f, 9}, {0.6f, 10}, {0.99f, 1}}) {
    RainFusionOptions rf = base;
    rf.sparsity = sparsity;
    const auto mask = adaptive(x, rf, 64);
    for (std::int64_t row = 0; row < 2 * 25; ++row) {
      int count = 0;
      for (std::int64_t j = 0; j < 25; ++j) count += mask[row * 25 + j];
      ASSERT_EQ(count, want) << "sparsity " << sparsity << " row " << row;
    }
  }
}

/// Pooled score of query block i against key block j for (b, head), in fp64 from the tensors.
template <class T>
double pooled_score(const QK<T>& x, std::int64_t b, std::int64_t head, std::int64_t i,
                    std::int64_t j, std::int64_t block_size, double scale) {
  const std::int64_t group = x.n / x.nkv;
  auto mean = [&](bool query, std::int64_t block, std::int64_t d) {
    const std::int64_t first = block * block_size, last = std::min(x.s, first + block_size);
    double sum = 0;
    for (std::int64_t s = first; s < last; ++s) {
      sum += query ? x.get_q(b, s, head, d) : x.get_k(b, s, head / group, d);
    }
    return sum / static_cast<double>(last - first);
  };
  double dot = 0;
  for (std::int64_t d = 0; d < x.d; ++d) dot += mean(true, i, d) * mean(false, j, d);
  return dot * scale;
}

template <class T>
void check_forced(const RainFusionOptions& rf, int block_size) {
  SCOPED_TRACE(describe(rf) + " block " + std::to_string(block_size));
  const std::int64_t S = tokens_of(rf), blocks = (S + block_size - 1) / block_size;
  const std::vector<bool> forced = forced_blocks(rf, block_size);
  const std::int64_t forced_count = std::count(forced.begin(), forced.end(), true);
  const std::int64_t keep = std::max(forced_count, kept_blocks(rf.sparsity, blocks));
  std::mt19937 rng(17);
  const int before = num_threads();
  std::vector<std::uint8_t> first;
  for (bool head_first : {false, true}) {
    QK<T> x(2, S, 4, 2, 24, head_first);
    rng.seed(17);  // the same logical values in both layouts
    std::normal_distribution<double> normal(0.0, 1.0);
    for (std::int64_t b = 0; b < 2; ++b) {
      for (std::int64_t s = 0; s < S; ++s) {
        for (std::int64_t d = 0; d < 24; ++d) {
          for (std::int64_t n = 0; n < 4; ++n) x.set_q(b, s, n, d, normal(rng));
          for (std::int64_t n = 0; n < 2; ++n)
            x.set_k(b, s, n, d, normal(rng) + 0.2 * (d == s % 5));
        }
      }
    }
    set_num_threads(1);
    const auto mask = adaptive(x, rf, block_size);
    set_num_threads(2);
    EXPECT_EQ(adaptive(x, rf, block_size), mask) << "2 threads differ from 1";
    const double scale = 1.0 / std::sqrt(24.0);
    for (std::int64_t b = 0; b < 2; ++b) {
      for (std::int64_t n = 0; n < 4; ++n) {
        for (std::int64_t i = 0; i < blocks; ++i) {
          const std::uint8_t* row = &mask[((b * 4 + n) * blocks + i) * blocks];
          const std::int64_t count = std::count(row, row + blocks, 1);
          if (forced[i]) {
            EXPECT_EQ(count, blocks) << "forced query block " << i << " not whole";
            continue;
          }
          EXPECT_EQ(count, keep) << "query block " << i;
          double lowest_kept = std::numeric_limits<double>::infinity();
          double highest_dropped = -std::numeric_limits<double>::infinity();
          for (std::int64_t j = 0; j < blocks; ++j) {
            if (forced[j]) {
              EXPECT_EQ(row[j], 1) << "forced key block " << j << " dropped by query block " << i;
              continue;
            }
            const double score = pooled_score(x, b, n, i, j, block_size, scale);
            if (row[j]) {
              lowest_kept = std::min(lowest_kept, score);
            } else {
              highest_dropped = std::max(highest_dropped, score);
            }
          }
          EXPECT_GE(lowest_kept, highest_dropped - 1e-9)
              << "query block " << i << " kept a lower pooled score than it dropped";
        }
      }
    }
    if (first.empty()) {
      first = mask;
    } else {
      EXPECT_EQ(first, mask) << "BNSD differs from BSND";
    }
  }
  set_num_threads(before);
}

TEST(RainFusionAdaptiveBlocks, ForcedTextAndFirstFrameBlocks) {
  // 70 text tokens + 3 x 5 x 40: text in blocks 0-1 and frame 0 in blocks 1-4 (64), block 0-2
  // (128); text last: frame 0 in blocks 0-3, text in 9-10.
  for (int block_size : {64, 128}) {
    check_forced<float>(options_of(3, 5, 40, 70, true, true, 0.7f), block_size);
    check_forced<float>(options_of(3, 5, 40, 70, false, true, 0.5f), block_size);
    check_forced<float>(options_of(3, 5, 40, 70, false, false, 0.8f), block_size);
    check_forced<bf16>(options_of(4, 7, 9, 0, true, true, 0.6f), block_size);
  }
  // More forced blocks than the budget: a free row keeps exactly the forced ones.
  check_forced<float>(options_of(2, 10, 30, 300, true, true, 0.9f), 64);
}

TEST(RainFusionAdaptiveBlocks, RejectsBadInputsBeforeWriting) {
  const RainFusionOptions rf = options_of(3, 5, 9, 7, true, true, 0.5f);
  const std::int64_t S = tokens_of(rf), nb = (S + 63) / 64;
  std::mt19937 rng(19);
  QK<float> x(2, S, 2, 1, 16, false);
  x.q.fill_normal(rng);
  x.k.fill_normal(rng);
  TestTensor<std::uint8_t> mask({2, 2, nb, nb});
  for (std::int64_t i = 0; i < mask.size(); ++i) mask.at(i) = 0x5A;
  const TensorView good = as_bool(mask.view());
  auto rejected = [&](auto&& call, const std::string& needle) {
    const auto before = mask.snapshot();
    const auto q_before = x.q.snapshot();
    try {
      call();
      ADD_FAILURE() << "no ditops::Error for: " << needle;
    } catch (const Error& error) {
      const std::string message = error.what();
      EXPECT_EQ(message.rfind("rainfusion_adaptive_blocks: ", 0), 0u) << message;
      EXPECT_NE(message.find(needle), std::string::npos) << message << " lacks " << needle;
    }
    EXPECT_TRUE(mask.unchanged_since(before)) << needle << ": block_mask written";
    EXPECT_TRUE(x.q.unchanged_since(q_before)) << needle << ": q written";
  };
  auto run = [&](const TensorView& q, const TensorView& k, const RainFusionOptions& options,
                 int block_size, const TensorView& out, const AttentionOptions& o = {}) {
    return [&, q, k, options, block_size, out, o] {
      rainfusion_adaptive_blocks(q, k, options, block_size, out, o);
    };
  };
  const TensorView q = x.q.view(), k = x.k.view();
  for (int block_size : {32, 0, 96, 256}) rejected(run(q, k, rf, block_size, good), "block_size");
  RainFusionOptions bad = rf;
  bad.textural_stride = 0;
  rejected(run(q, k, bad, 64, good), "rf.textural_stride");
  bad = rf;
  bad.sparsity = 1.0f;
  rejected(run(q, k, bad, 64, good), "rf.sparsity");
  bad = rf;
  bad.recall_threshold = 0.f;
  rejected(run(q, k, bad, 64, good), "rf.recall_threshold");
  bad = rf;
  bad.video.text_tokens = 8;  // S + 1
  rejected(run(q, k, bad, 64, good), "q.shape[1]");
  TensorView wrong = good;
  wrong.shape[3] = nb + 1;
  rejected(run(q, k, rf, 64, wrong), "block_mask");
  wrong = good;
  wrong.shape[1] = 1;  // no broadcasting here
  rejected(run(q, k, rf, 64, wrong), "block_mask");
  rejected(run(q, k, rf, 128, good), "block_mask");  // nb for 128 differs
  wrong = mask.view();
  rejected(run(q, k, rf, 64, wrong), "block_mask.dtype");
  wrong = good;
  wrong.rank = 3;
  rejected(run(q, k, rf, 64, wrong), "block_mask has rank 3");
  wrong = good;
  wrong.strides[1] = 0;
  rejected(run(q, k, rf, 64, wrong), "block_mask");
  wrong = good;
  wrong.data = x.q.view().data;  // inside q
  rejected(run(q, k, rf, 64, wrong), "block_mask may overlap q");
  AttentionOptions causal;
  causal.causal = true;
  rejected(run(q, k, rf, 64, good, causal), "options.causal");
  std::vector<float> additive(S * S, 0.f);
  AttentionOptions masked;
  masked.attn_mask = view(additive.data(), {S, S});
  rejected(run(q, k, rf, 64, good, masked), "options.attn_mask");
}

}  // namespace
}  // namespace ditops::test
