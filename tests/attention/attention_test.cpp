// attention_forward against the fp64 reference over the sweep (lengths 1, 7, 64, 127,
// 1000 and one 4096, head configs 1/1, 8/8, 8/2, 24/24, D 64..256, Dv != Dk, MLA 576/512,
// causal with Sq < Sk and Sq > Sk, every mask kind and broadcast, both layouts, 1 and 2
// threads), on every dtype; identities (one key gives V, causal Sq = 1 is the last row of
// non-causal, thread count), and every class of bad input.

#include <cmath>
#include <ditops/attention.hpp>
#include <ditops/runtime.hpp>
#include <limits>
#include <vector>

#include "tests/reference/attention_ref.hpp"
#include "tests/support/expect_rejected.hpp"
#include "tests/support/tolerance.hpp"

namespace ditops::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

enum class MaskCase {
  none,
  key_padding,     ///< bool [B, 1, 1, Sk]
  rank2_bool,      ///< bool [Sq, Sk], row 0 fully masked
  full_bool,       ///< bool [B, N, Sq, Sk]
  additive_heads,  ///< f32 [1, N, Sq, Sk] with some -inf
  additive_rank2,  ///< f32 [Sq, Sk] broadcast over B and N
  query_bool,      ///< bool [B, 1, Sq, 1]... not allowed (Sk must match): see bad inputs
};

const char* mask_name(MaskCase m) {
  const char* names[] = {"none",           "key_padding",    "rank2_bool", "full_bool",
                         "additive_heads", "additive_rank2", "query_bool"};
  return names[static_cast<int>(m)];
}

struct DenseCase {
  std::int64_t b = 1, sq = 1, sk = 1, n = 1, nkv = 1, dk = 64, dv = 64;
  bool causal = false, head_first = false;
  MaskCase mask = MaskCase::none;
  int threads = 1;
  AttentionBackend backend = AttentionBackend::flash;

  std::string describe() const {
    return "b" + std::to_string(b) + " sq" + std::to_string(sq) + " sk" + std::to_string(sk) +
           " n" + std::to_string(n) + "/" + std::to_string(nkv) + " d" + std::to_string(dk) + "/" +
           std::to_string(dv) + (causal ? " causal" : "") + (head_first ? " bnsd" : " bsnd") +
           " mask:" + mask_name(mask) + " threads " + std::to_string(threads) + " backend " +
           backend_name(backend) + " isa " + active_isa_name();
  }

  std::vector<std::int64_t> shape(std::int64_t s, std::int64_t heads, std::int64_t d) const {
    return attention_shape(head_first, b, s, heads, d);
  }
  std::int64_t index(std::int64_t bi, std::int64_t s, std::int64_t h, std::int64_t d,
                     std::int64_t len, std::int64_t heads, std::int64_t dim) const {
    return attention_index(head_first, bi, s, h, d, len, heads, dim);
  }

  template <class T>
  void run(std::mt19937& rng) const {
    set_num_threads(threads);
    TestTensor<T> q(shape(sq, n, dk), 3), k(shape(sk, nkv, dk), 1), v(shape(sk, nkv, dv)),
        out(shape(sq, n, dv), 2);
    TestTensor<float> lse({b, n, sq});
    q.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
    std::vector<std::int64_t> mask_shape;
    switch (mask) {
      case MaskCase::key_padding:
        mask_shape = {b, 1, 1, sk};
        break;
      case MaskCase::rank2_bool:
        mask_shape = {sq, sk};
        break;
      case MaskCase::full_bool:
        mask_shape = {b, n, sq, sk};
        break;
      case MaskCase::additive_heads:
        mask_shape = {1, n, sq, sk};
        break;
      case MaskCase::additive_rank2:
        mask_shape = {sq, sk};
        break;
      default:
        mask_shape = {1};
    }
    TestTensor<std::uint8_t> bool_mask(mask_shape);
    TestTensor<float> float_mask(mask_shape);
    std::bernoulli_distribution attend(0.8);
    std::normal_distribution<float> bias(0.f, 1.f);
    for (std::int64_t i = 0; i < bool_mask.size(); ++i) {
      bool_mask.at(i) = attend(rng);
      float_mask.at(i) = attend(rng) ? bias(rng) : -kInf;
    }
    if (mask == MaskCase::rank2_bool) {  // a fully masked query row
      for (std::int64_t j = 0; j < sk; ++j) bool_mask.at(j) = false;
    }
    if (mask == MaskCase::key_padding) {  // long runs of padding: whole blocks skipped
      for (std::int64_t bi = 0; bi < b; ++bi) {
        for (std::int64_t j = 0; j < sk; ++j) bool_mask.at(bi * sk + j) = j < sk / 2 + bi;
      }
    }
    const bool is_bool = mask == MaskCase::key_padding || mask == MaskCase::rank2_bool ||
                         mask == MaskCase::full_bool;
    const bool is_float = mask == MaskCase::additive_heads || mask == MaskCase::additive_rank2;

    AttentionRefProblem ref_problem{b,      sq, sk, n,  nkv, dk, dv, 1.0 / std::sqrt(double(dk)),
                                    causal, {}, {}, {}, {},  {}};
    ref_problem.q = [&](auto bi, auto s, auto h, auto d) {
      return q.value(index(bi, s, h, d, sq, n, dk));
    };
    ref_problem.k = [&](auto bi, auto s, auto h, auto d) {
      return k.value(index(bi, s, h, d, sk, nkv, dk));
    };
    ref_problem.v = [&](auto bi, auto s, auto h, auto d) {
      return v.value(index(bi, s, h, d, sk, nkv, dv));
    };
    auto mask_index = [&](std::int64_t bi, std::int64_t h, std::int64_t i, std::int64_t j) {
      if (mask_shape.size() == 2) return i * sk + j;
      const std::int64_t mb = mask_shape[0] == 1 ? 0 : bi, mh = mask_shape[1] == 1 ? 0 : h,
                         mi = mask_shape[2] == 1 ? 0 : i;
      return ((mb * mask_shape[1] + mh) * mask_shape[2] + mi) * sk + j;
    };
    if (is_bool) {
      ref_problem.allowed = [&](auto bi, auto h, auto i, auto j) {
        return bool_mask.at(mask_index(bi, h, i, j)) != 0;
      };
    }
    if (is_float) {
      ref_problem.allowed = [&](auto bi, auto h, auto i, auto j) {
        return float_mask.at(mask_index(bi, h, i, j)) != -kInf;
      };
      ref_problem.bias = [&](auto bi, auto h, auto i, auto j) {
        return static_cast<double>(float_mask.at(mask_index(bi, h, i, j)));
      };
    }
    const AttentionRefResult ref = attention_reference(ref_problem);

    AttentionOptions options;
    options.causal = causal;
    options.head_first = head_first;
    options.lse = lse.view();
    options.backend = backend;
    if (is_bool) options.attn_mask = as_bool(bool_mask.view());
    if (is_float) options.attn_mask = float_mask.view();
    attention_forward(q.view(), k.view(), v.view(), out.view(), options);

    std::vector<double> expected(out.size());
    for (std::int64_t bi = 0; bi < b; ++bi) {
      for (std::int64_t s = 0; s < sq; ++s) {
        for (std::int64_t h = 0; h < n; ++h) {
          for (std::int64_t d = 0; d < dv; ++d) {
            expected[index(bi, s, h, d, sq, n, dv)] = ref.at(ref_problem, bi, s, h, d);
          }
        }
      }
    }
    expect_close(out, expected, attention_tolerance<T>(backend, ref.magnitudes), describe());
    std::int64_t lse_failures = 0;
    for (std::int64_t i = 0; i < lse.size(); ++i) {
      const double want = ref.lse[i], got = lse.value(i);
      const double lse_tol = attention_lse_tolerance(backend, ref.magnitudes);
      const bool ok = std::isinf(want) ? got == want : std::fabs(got - want) <= lse_tol;
      lse_failures += !ok;
      if (!ok && lse_failures == 1) {
        ADD_FAILURE() << describe() << ": lse[" << i << "] = " << got << ", expected " << want;
      }
    }
    EXPECT_EQ(lse_failures, 0) << describe();
    EXPECT_EQ(lse.damaged_canaries(), 0) << describe();
  }
};

/// The sweep, trimmed so the fp64 reference stays under ~2e7 multiply-adds per case.
std::vector<DenseCase> sweep() {
  const std::int64_t lens[] = {1, 7, 64, 127, 1000};
  const std::int64_t heads[][2] = {{1, 1}, {8, 8}, {8, 2}, {24, 24}};
  const std::int64_t dims[] = {64, 72, 80, 96, 128, 256};
  std::vector<DenseCase> cases;
  int index = 0;
  for (std::int64_t sq : lens) {
    for (std::int64_t sk : lens) {
      DenseCase c;
      c.sq = sq;
      c.sk = sk;
      c.b = 1 + index % 3;
      c.n = heads[index % 4][0];
      c.nkv = heads[index % 4][1];
      c.dk = c.dv = dims[index % 6];
      c.causal = index % 2 == 1;
      c.head_first = (index / 2) % 2 == 1;
      c.threads = 1 + (index / 3) % 2;
      auto cost = [&] { return c.b * c.n * c.sq * c.sk * (c.dk + c.dv); };
      while (cost() > 20'000'000 && c.b > 1) --c.b;
      if (cost() > 20'000'000) c.n = c.nkv = 1;
      cases.push_back(c);
      ++index;
    }
  }
  // The long case, cross-attention with Sq < Sk and Sq > Sk under causal masking.
  cases.push_back({1, 64, 4096, 2, 1, 64, 64, true, false, MaskCase::none, 2});
  cases.push_back({1, 200, 70, 2, 2, 64, 64, true, true, MaskCase::none, 1});
  cases.push_back({2, 130, 300, 4, 2, 64, 64, true, false, MaskCase::none, 2});
  // Dv != Dk, MLA prefill's 576 / 512.
  cases.push_back({1, 70, 90, 4, 2, 64, 32, false, false, MaskCase::none, 1});
  cases.push_back({1, 70, 90, 4, 2, 80, 136, true, true, MaskCase::none, 2});
  cases.push_back({1, 19, 127, 2, 1, 576, 512, true, false, MaskCase::none, 1});
  // Masks: every kind and broadcast, alone and with causal.
  for (MaskCase m : {MaskCase::key_padding, MaskCase::rank2_bool, MaskCase::full_bool,
                     MaskCase::additive_heads, MaskCase::additive_rank2}) {
    cases.push_back({2, 67, 200, 4, 2, 64, 64, false, false, m, 1});
    cases.push_back({1, 130, 150, 2, 1, 72, 72, true, true, m, 2});
    cases.push_back({3, 1, 300, 8, 2, 64, 64, false, false, m, 2});
  }
  return cases;
}

TEST(AttentionFlash, F32MatchesReferenceOverSweep) {
  std::mt19937 rng(11);
  for (const DenseCase& c : sweep()) c.run<float>(rng);
}

// flash_bf16 on bf16 inputs over the same sweep: with AVX512-BF16, Q·K^T and P·V on bf16 dot
// products (tails of Sq, Sk and of the key pairs, odd Dk / Dv, GQA, causal, masks, LSE);
// elsewhere flash's fp32 dot products on the same values.
TEST(AttentionFlashBf16, Bf16MatchesReferenceOverSweep) {
  std::mt19937 rng(14);
  for (DenseCase c : sweep()) {
    c.backend = AttentionBackend::flash_bf16;
    c.run<bf16>(rng);
  }
}

TEST(AttentionReference, MatchesFp64Oracle) {
  std::mt19937 rng(12);
  for (DenseCase c : {DenseCase{2, 67, 130, 4, 2, 64, 48, true, false, MaskCase::additive_heads, 2},
                      DenseCase{1, 5, 70, 2, 2, 72, 72, false, true, MaskCase::rank2_bool, 1}}) {
    c.backend = AttentionBackend::reference;
    c.run<float>(rng);
  }
}

TEST(AttentionAutomatic, TunedChoiceMatchesReference) {
  std::mt19937 rng(13);
  for (DenseCase c : {DenseCase{1, 100, 130, 4, 2, 64, 64, true, false, MaskCase::none, 2},
                      DenseCase{1, 1, 700, 8, 2, 64, 64, false, false, MaskCase::key_padding, 2}}) {
    c.backend = AttentionBackend::automatic;
    c.run<float>(rng);
  }
}

template <class T>
class AttentionNarrow : public ::testing::Test {};
using NarrowTypes = ::testing::Types<bf16, f16>;
TYPED_TEST_SUITE(AttentionNarrow, NarrowTypes);

TYPED_TEST(AttentionNarrow, MatchesReference) {
  std::mt19937 rng(21);
  const std::vector<DenseCase> cases = {
      {1, 127, 127, 8, 2, 64, 64, true, false, MaskCase::none, 2},
      {2, 7, 1000, 8, 2, 128, 128, false, true, MaskCase::none, 2},
      {1, 64, 64, 4, 4, 72, 72, false, false, MaskCase::full_bool, 1},
      {1, 1, 300, 8, 1, 96, 80, false, false, MaskCase::additive_rank2, 1},
      {1, 19, 70, 2, 1, 576, 512, true, false, MaskCase::none, 1},
  };
  for (const DenseCase& c : cases) c.template run<TypeParam>(rng);
  for (DenseCase c : cases) {  // flash_bf16: bf16 dot products where the CPU has them
    c.backend = AttentionBackend::flash_bf16;
    c.template run<TypeParam>(rng);
  }
}

// ---- identities ---------------------------------------------------------------------------

TEST(AttentionProperties, OneKeyGivesV) {
  std::mt19937 rng(31);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    TestTensor<float> q({2, 9, 4, 64}), k({2, 1, 2, 64}), v({2, 1, 2, 40}), out({2, 9, 4, 40});
    q.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
    attention_forward(q.view(), k.view(), v.view(), out.view());
    std::vector<double> expected(out.size());
    for (std::int64_t i = 0; i < out.size(); ++i) {
      const std::int64_t d = i % 40, h = (i / 40) % 4, b = i / (40 * 4 * 9);
      expected[i] = v.value((b * 2 + h / 2) * 40 + d);
    }
    expect_close(out, expected, {1e-6, 1e-7}, "one key");
  }
}

TEST(AttentionProperties, CausalSingleQueryIsLastRowOfNonCausal) {
  std::mt19937 rng(32);
  constexpr std::int64_t kS = 300, kN = 4, kD = 64;
  TestTensor<float> q({1, kS, kN, kD}), k({1, kS, 2, kD}), v({1, kS, 2, kD}), out({1, kS, kN, kD});
  TestTensor<float> last({1, 1, kN, kD}), out_last({1, 1, kN, kD});
  q.fill_normal(rng);
  k.fill_normal(rng);
  v.fill_normal(rng);
  for (std::int64_t i = 0; i < kN * kD; ++i) last.at(i) = q.at((kS - 1) * kN * kD + i);
  AttentionOptions options;
  options.backend = AttentionBackend::flash;
  attention_forward(q.view(), k.view(), v.view(), out.view(), options);
  options.causal = true;
  attention_forward(last.view(), k.view(), v.view(), out_last.view(), options);
  std::vector<double> expected(kN * kD);
  for (std::int64_t i = 0; i < kN * kD; ++i) expected[i] = out.value((kS - 1) * kN * kD + i);
  expect_close(out_last, expected, {1e-5, 1e-6}, "causal Sq=1 vs last row");
}

TEST(AttentionProperties, ThreadCountOnlyReassociates) {
  std::mt19937 rng(33);
  // Decode-like (split-KV with 2 threads) and prefill-like shapes.
  for (auto [sq, sk] : {std::pair<std::int64_t, std::int64_t>{1, 2000}, {200, 300}}) {
    TestTensor<float> q({1, sq, 8, 64}), k({1, sk, 2, 64}), v({1, sk, 2, 64});
    TestTensor<float> out1({1, sq, 8, 64}), out2({1, sq, 8, 64});
    q.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
    AttentionOptions options;
    options.backend = AttentionBackend::flash;
    set_num_threads(1);
    attention_forward(q.view(), k.view(), v.view(), out1.view(), options);
    set_num_threads(2);
    attention_forward(q.view(), k.view(), v.view(), out2.view(), options);
    std::vector<double> expected(out1.size());
    for (std::int64_t i = 0; i < out1.size(); ++i) expected[i] = out1.value(i);
    expect_close(out2, expected, {1e-5, 1e-6}, "threads 2 vs 1");
  }
}

// Packed K and V live in scratch the calling thread keeps between calls. A call after a larger
// one whose K and V were all NaN reuses those buffers: it must read nothing the last call left
// (a partial last block, causal diagonals, 1 and 2 threads, fp32 and converted bf16 K and V,
// flash's packing and int8's quantized K and V), giving bit for bit what it gives on freshly
// allocated scratch.
template <class T>
void expect_scratch_reuse_invisible(AttentionBackend backend, bool causal, int threads) {
  set_num_threads(threads);
  const std::string context = std::string(backend_name(backend)) +
                              (causal ? " causal" : " non-causal") + " threads " +
                              std::to_string(threads) + " isa " + active_isa_name();
  std::mt19937 rng(57);
  TestTensor<T> big_q({1, 64, 2, 64}), big_k({1, 300, 2, 64}), big_v({1, 300, 2, 64}),
      big_out({1, 64, 2, 64});
  big_q.fill_normal(rng);
  for (std::int64_t i = 0; i < big_k.size(); ++i) {
    big_k.at(i) = from_float<T>(std::numeric_limits<float>::quiet_NaN());
    big_v.at(i) = big_k.at(i);
  }
  TestTensor<T> q({1, 40, 4, 64}), k({1, 77, 2, 64}), v({1, 77, 2, 64}), fresh({1, 40, 4, 64}),
      reused({1, 40, 4, 64});
  q.fill_normal(rng);
  k.fill_normal(rng);
  v.fill_normal(rng);
  AttentionOptions options;
  options.backend = backend;
  options.causal = causal;
  release_thread_scratch();
  attention_forward(q.view(), k.view(), v.view(), fresh.view(), options);
  attention_forward(big_q.view(), big_k.view(), big_v.view(), big_out.view(), options);
  attention_forward(q.view(), k.view(), v.view(), reused.view(), options);
  for (std::int64_t i = 0; i < fresh.size(); ++i) {
    ASSERT_TRUE(std::isfinite(reused.value(i))) << context << " element " << i;
    ASSERT_TRUE(same_bits(fresh.at(i), reused.at(i))) << context << " element " << i;
  }
  EXPECT_EQ(reused.damaged_canaries(), 0) << context;
}

TEST(AttentionScratch, ReusedScratchHoldsNothingOfTheLastCall) {
  for (const AttentionBackend backend : {AttentionBackend::flash, AttentionBackend::int8}) {
    for (const bool causal : {false, true}) {
      for (const int threads : {1, 2}) {
        expect_scratch_reuse_invisible<float>(backend, causal, threads);
        expect_scratch_reuse_invisible<bf16>(backend, causal, threads);
      }
    }
  }
}

// Non-finite data is the caller's choice: a NaN or infinity in batch element 0 (q, k, v, an
// additive mask) propagates within it and never crashes, writes outside out or reaches batch
// element 1, on every backend (the split-KV path with 2 threads and a long KV too).
TEST(AttentionNonFinite, NanAndInfStayInTheirBatchElement) {
  set_num_threads(2);
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  for (const std::int64_t sq : {1, 40}) {
    TestTensor<float> q({2, sq, 4, 64}), k({2, 600, 2, 64}), v({2, 600, 2, 64}),
        out({2, sq, 4, 64}), lse({2, 4, sq}), mask({2, 1, 1, 600});
    std::mt19937 rng(94);
    q.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
    q.at(3) = kNan;
    k.at(64 * 5 + 1) = kInf;
    k.at(64 * 7 + 2) = -kInf;
    v.at(64 * 9 + 3) = kNan;
    mask.at(11) = kNan;
    for (const AttentionBackend backend :
         {AttentionBackend::reference, AttentionBackend::flash, AttentionBackend::flash_bf16,
          AttentionBackend::int8, AttentionBackend::automatic}) {
      for (const bool masked : {false, true}) {
        AttentionOptions options;
        options.backend = backend;
        options.lse = lse.view();
        if (masked) options.attn_mask = mask.view();
        attention_forward(q.view(), k.view(), v.view(), out.view(), options);
        const std::string context = std::string(backend_name(backend)) + " sq " +
                                    std::to_string(sq) + (masked ? " masked" : "");
        EXPECT_EQ(out.damaged_canaries(), 0) << context;
        EXPECT_EQ(lse.damaged_canaries(), 0) << context;
        for (std::int64_t e = out.size() / 2; e < out.size(); ++e) {
          ASSERT_TRUE(std::isfinite(out.value(e))) << context << " element " << e;
        }
      }
    }
  }
}

// ---- bad input -----------------------------------------------------------------------------

TEST(AttentionBadInput, EveryInvalidArgumentThrowsBeforeWriting) {
  TestTensor<float> q({2, 8, 4, 64}), k({2, 10, 2, 64}), v({2, 10, 2, 32}), out({2, 8, 4, 32});
  TestTensor<float> k_wrong_d({2, 10, 2, 48}), v_wrong_s({2, 11, 2, 32}), k_three({2, 10, 3, 64});
  TestTensor<float> out_wrong({2, 8, 4, 64}), lse({2, 4, 8}), lse_wrong({2, 8, 4});
  TestTensor<bf16> k_bf16({2, 10, 2, 64});
  TestTensor<std::uint8_t> mask_bad({2, 4, 8, 9}), mask3({4, 8, 10});
  TestTensor<std::int32_t> mask_int({8, 10});
  const auto run = [&](const TensorView& kv, const TensorView& vv, const TensorView& ov,
                       AttentionOptions options = {}) {
    return [=, &q] { attention_forward(q.view(), kv, vv, ov, options); };
  };
  expect_rejected(run(k_wrong_d.view(), v.view(), out.view()),
                  "k.shape[3] (48) must equal q.shape[3] (64)", out);
  expect_rejected(run(v_wrong_s.view(), v_wrong_s.view(), out.view()), "k.shape[3]", out);
  expect_rejected(run(k.view(), v_wrong_s.view(), out.view()),
                  "v.shape[1] (11) must equal k.shape[1] (10)", out);
  expect_rejected(run(k_three.view(), TestTensor<float>({2, 10, 3, 32}).view(), out.view()),
                  "must be a multiple of k.shape[2] (3 KV heads)", out);
  expect_rejected(run(k.view(), v.view(), out_wrong.view()),
                  "out.shape[3] (64) must equal v.shape[3] (32)", out);
  expect_rejected(run(k_bf16.view(), v.view(), out.view()),
                  "k.dtype (bf16) must equal q.dtype (f32)", out);
  AttentionOptions options;
  options.scale = std::nanf("");
  expect_rejected(run(k.view(), v.view(), out.view(), options), "scale", out);
  options.scale = 0.f;
  expect_rejected(run(k.view(), v.view(), out.view(), options),
                  "scale (0) must be finite, > 0 and <= 65536", out);
  options.scale = -1.f;
  expect_rejected(run(k.view(), v.view(), out.view(), options), "scale", out);
  options = {};
  options.attn_mask = as_bool(mask_bad.view());
  expect_rejected(run(k.view(), v.view(), out.view(), options),
                  "attn_mask [2, 4, 8, 9] is not broadcastable", out);
  options.attn_mask = as_bool(mask3.view());
  expect_rejected(run(k.view(), v.view(), out.view(), options), "attn_mask has rank 3", out);
  options.attn_mask = mask_int.view();
  expect_rejected(run(k.view(), v.view(), out.view(), options), "attn_mask.dtype is i32", out);
  options = {};
  options.lse = lse_wrong.view();
  expect_rejected(run(k.view(), v.view(), out.view(), options), "lse [2, 8, 4] must be [B, N, Sq]",
                  out);
  options.lse = lse.view();
  options.head_first = true;  // now q is read as [B, N=8, S=4, D]: heads 8 vs KV heads 10
  expect_rejected(run(k.view(), v.view(), out.view(), options), "KV heads", out);
  // out aliasing an input.
  expect_rejected([&] { attention_forward(q.view(), k.view(), v.view(), q.view()); }, "out", out);
  TensorView null_q = q.view();
  null_q.data = nullptr;
  expect_rejected([&] { attention_forward(null_q, k.view(), v.view(), out.view()); },
                  "q.data is null", out);
  // A backend value outside the enum (cast from an integer) used to run silently.
  options = {};
  options.backend = static_cast<AttentionBackend>(42);
  expect_rejected(run(k.view(), v.view(), out.view(), options),
                  "attention_forward: options.backend (42) is not an AttentionBackend", out);
  VarlenOptions varlen;
  varlen.backend = static_cast<AttentionBackend>(-1);
  TestTensor<float> tq({8, 4, 64}), tk({10, 2, 64}), tv({10, 2, 32}), tout({8, 4, 32});
  const std::vector<std::int32_t> cu_q = {0, 8}, cu_k = {0, 10};
  expect_rejected(
      [&] {
        attention_forward_varlen(tq.view(), tk.view(), tv.view(), cu_q, cu_k, tout.view(), varlen);
      },
      "options.backend (-1) is not an AttentionBackend", tout);
}

// Broadcast inputs whose workspace no machine holds: packed K of 2^24 keys x 2^20 channels is
// 64 TiB; select_attention's own output for 2^44 query rows is 128 TiB, and for 2^31 x 2^31 rows
// its size overflows int64. Each is an Error naming the call and the size, before any memory is
// touched, never an abort (the sizes exceed any machine, so the test does not depend on this
// one's memory).
TEST(AttentionBadInput, WorkspacesNoMachineHoldsAreErrorsNamingTheCallAndSize) {
  set_num_threads(1);
  std::vector<float> wide(std::size_t{1} << 20, 0.5f), narrow(16, 0.25f), one(1, 1.f);
  TestTensor<float> out({1, 32, 1, 16});
  AttentionOptions flash;
  flash.backend = AttentionBackend::flash;
  expect_rejected(
      [&] {
        attention_forward(broadcast_row(wide, 1, 32, 1), broadcast_row(wide, 1, 1 << 24, 1),
                          broadcast_row(narrow, 1, 1 << 24, 1), out.view(), flash);
      },
      "attention_forward: cannot allocate 70368744177664 bytes (65536.0 GiB) of scratch", out);
  expect_rejected(
      [&] {
        select_attention(broadcast_row(one, 1, std::int64_t{1} << 44, 1),
                         broadcast_row(one, 1, 4, 1), broadcast_row(one, 1, 4, 1));
      },
      "select_attention: cannot allocate 140737488355328 bytes (131072.0 GiB)", out);
  expect_rejected(
      [&] {
        select_attention(broadcast_row(one, std::int64_t{1} << 31, std::int64_t{1} << 31, 1),
                         broadcast_row(one, std::int64_t{1} << 31, 4, 1),
                         broadcast_row(one, std::int64_t{1} << 31, 4, 1));
      },
      "select_attention: q, k and v (Dk 1, Dv 1, 1 heads) need more than 2^63 bytes", out);
}

}  // namespace
}  // namespace ditops::test
