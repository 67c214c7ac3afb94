// attention_forward_varlen: packed sequences (including empty ones) against the fp64
// reference of each sequence, causal and not, GQA, LSE; and cu_seqlens validation.

#include <ditops/attention.hpp>
#include <ditops/runtime.hpp>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "tests/reference/attention_ref.hpp"
#include "tests/support/expect_rejected.hpp"
#include "tests/support/scoped_env.hpp"
#include "tests/support/temp_dir.hpp"
#include "tests/support/tolerance.hpp"

namespace ditops::test {
namespace {

struct VarlenRun {
  AttentionChoice ran;                      ///< what the library says ran (VarlenOptions::ran)
  std::int64_t beyond_flash_tolerance = 0;  ///< outputs outside flash's fp32 tolerance
};

/// One varlen call against the fp64 reference of each sequence, checked with the tolerance of
/// the backend that ran.
template <class T>
VarlenRun check_varlen(const std::vector<std::int32_t>& q_lens,
                       const std::vector<std::int32_t>& k_lens, std::int64_t n, std::int64_t nkv,
                       std::int64_t dk, std::int64_t dv, bool causal, int threads,
                       std::mt19937& rng, AttentionBackend backend = AttentionBackend::flash) {
  set_num_threads(threads);
  std::vector<std::int32_t> cu_q{0}, cu_k{0};
  for (std::size_t i = 0; i < q_lens.size(); ++i) {
    cu_q.push_back(cu_q.back() + q_lens[i]);
    cu_k.push_back(cu_k.back() + k_lens[i]);
  }
  const std::int64_t tq = cu_q.back(), tk = cu_k.back();
  TestTensor<T> q({tq, n, dk}, 1), k({tk, nkv, dk}), v({tk, nkv, dv}, 2), out({tq, n, dv}, 1);
  TestTensor<float> lse({n, tq});
  q.fill_normal(rng);
  k.fill_normal(rng);
  v.fill_normal(rng);
  VarlenOptions options;
  options.causal = causal;
  options.lse = lse.view();
  options.backend = backend;
  VarlenRun run;
  options.ran = &run.ran;
  attention_forward_varlen(q.view(), k.view(), v.view(), cu_q, cu_k, out.view(), options);

  std::vector<double> expected(out.size()), expected_lse(lse.size());
  AttentionMagnitudes magnitudes;
  for (std::size_t s = 0; s < q_lens.size(); ++s) {
    const std::int64_t q0 = cu_q[s], k0 = cu_k[s];
    AttentionRefProblem p{
        1,      q_lens[s], k_lens[s], n,  nkv, dk, dv, 1.0 / std::sqrt(double(dk)),
        causal, {},        {},        {}, {},  {}};
    p.q = [&](auto, auto i, auto h, auto d) { return q.value(((q0 + i) * n + h) * dk + d); };
    p.k = [&](auto, auto j, auto h, auto d) { return k.value(((k0 + j) * nkv + h) * dk + d); };
    p.v = [&](auto, auto j, auto h, auto d) { return v.value(((k0 + j) * nkv + h) * dv + d); };
    const AttentionRefResult ref = attention_reference(p);
    magnitudes.include(ref.magnitudes);
    for (std::int64_t i = 0; i < q_lens[s]; ++i) {
      for (std::int64_t h = 0; h < n; ++h) {
        for (std::int64_t d = 0; d < dv; ++d) {
          expected[((q0 + i) * n + h) * dv + d] = ref.at(p, 0, i, h, d);
        }
        expected_lse[h * tq + q0 + i] = ref.lse[h * q_lens[s] + i];
      }
    }
  }
  const std::string context = std::string("varlen ") + dtype_name(detail::dtype_of<T>()) +
                              (causal ? " causal" : "") + " threads " + std::to_string(threads) +
                              " isa " + active_isa_name() + ", ran " + run.ran.detail;
  expect_close(out, expected, attention_tolerance<T>(run.ran.backend, magnitudes), context);
  for (std::int64_t i = 0; i < lse.size(); ++i) {
    const double want = expected_lse[i], got = lse.value(i);
    if (std::isinf(want)) {
      EXPECT_EQ(got, want) << context << " lse " << i;
    } else {
      EXPECT_NEAR(got, want, attention_lse_tolerance(run.ran.backend, magnitudes))
          << context << " lse " << i;
    }
  }
  for (std::int64_t i = 0; i < out.size(); ++i) {
    run.beyond_flash_tolerance += !within(out.value(i), expected[i], flash_tolerance<T>());
  }
  return run;
}

TEST(AttentionVarlen, MatchesPerSequenceReference) {
  std::mt19937 rng(41);
  // Mixed lengths with empty sequences (q empty, k empty, both), one long sequence that
  // becomes several tasks, and Sq != Sk per sequence.
  const std::vector<std::int32_t> q_lens = {5, 0, 300, 1, 64, 0, 130, 7};
  const std::vector<std::int32_t> k_lens = {9, 4, 300, 70, 64, 0, 100, 0};
  for (bool causal : {false, true}) {
    for (int threads : {1, 2}) {
      check_varlen<float>(q_lens, k_lens, 4, 2, 64, 64, causal, threads, rng);
    }
  }
  check_varlen<float>({1, 1, 1}, {900, 3, 700}, 8, 1, 72, 40, false, 2, rng);
  check_varlen<bf16>(q_lens, k_lens, 8, 8, 80, 80, true, 2, rng);
}

// A requested backend that refuses the call (sparse serves no varlen call) runs the tuner's
// choice for the call's key, and on a CPU with AVX512-BF16 that may be flash_bf16 with its bf16
// dot products, whose error is flash_bf16's, not flash's. Two calls in a row: the first tunes
// the key into the cache file, which is then made to hold flash_bf16 (as tuning may choose);
// the second asks for sparse. VarlenOptions::ran says what ran, and its tolerance holds.
TEST(AttentionVarlen, RefusedBackendRunsTheTunedChoiceAndSaysWhich) {
  std::mt19937 rng(43);
  const TempDir dir;
  const std::string path = dir.path() + "/tune.json";
  const ScopedEnv cache("DITOPS_TUNE_CACHE", path), forced("DITOPS_ATTN_BACKEND", std::nullopt);
  forget_attention_tuning();
  const std::vector<std::int32_t> q_lens = {40, 25}, k_lens = {70, 33};
  const VarlenRun tuned =
      check_varlen<bf16>(q_lens, k_lens, 4, 2, 64, 64, false, 1, rng, AttentionBackend::automatic);
  EXPECT_FALSE(tuned.ran.from_cache) << tuned.ran.detail;

  nlohmann::json document = nlohmann::json::parse(std::ifstream(path));
  ASSERT_EQ(document["entries"].size(), 1u) << document.dump();
  document["entries"][0]["config"] = "flash_bf16 k=packed row_group=16";
  std::ofstream(path) << document.dump();
  forget_attention_tuning();  // else the process keeps what it tuned

  testing::internal::CaptureStderr();
  const VarlenRun refused =
      check_varlen<bf16>(q_lens, k_lens, 4, 2, 64, 64, false, 1, rng, AttentionBackend::sparse);
  testing::internal::GetCapturedStderr();
  EXPECT_EQ(refused.ran.backend, AttentionBackend::flash_bf16) << refused.ran.detail;
  EXPECT_TRUE(refused.ran.from_cache);
  EXPECT_NE(refused.ran.detail.find(
                "(options.backend=sparse: it serves attention_forward, not varlen calls)"),
            std::string::npos)
      << refused.ran.detail;
  // Where the bf16 dot products ran, flash's tolerance (what a caller checking against the
  // backend it asked for would use) does not hold: the report is what makes the check right.
  if (refused.ran.detail.find("no AVX512-BF16") == std::string::npos) {
    EXPECT_GT(refused.beyond_flash_tolerance, 0) << refused.ran.detail;
  }
}

TEST(AttentionVarlen, BadCuSeqlensThrowBeforeWriting) {
  TestTensor<float> q({10, 4, 64}), k({12, 2, 64}), v({12, 2, 64}), out({10, 4, 64}),
      lse_bad({10, 4});
  const auto run = [&](std::vector<std::int32_t> cu_q, std::vector<std::int32_t> cu_k,
                       VarlenOptions options = {}) {
    return [&, cu_q, cu_k, options] {
      attention_forward_varlen(q.view(), k.view(), v.view(), cu_q, cu_k, out.view(), options);
    };
  };
  expect_rejected(run({1, 4, 10}, {0, 6, 12}), "cu_seqlens_q[0] (1) must be 0", out);
  expect_rejected(run({0, 6, 4, 10}, {0, 2, 6, 12}), "cu_seqlens_q[2] (4) is less than", out);
  expect_rejected(run({0, 4, 10}, {0, 6, 13}), "cu_seqlens_k ends at 13 but k.shape[0] is 12", out);
  expect_rejected(run({0, 4, 11}, {0, 6, 12}), "cu_seqlens_q ends at 11", out);
  expect_rejected(run({0, 4, 10}, {0, 12}), "cu_seqlens_q has 3 entries but cu_seqlens_k has 2",
                  out);
  expect_rejected(run({}, {}), "cu_seqlens_q is empty", out);
  VarlenOptions options;
  options.lse = lse_bad.view();
  expect_rejected(run({0, 4, 10}, {0, 6, 12}, options), "lse [10, 4] must be [N, Tq]", out);
  options = {};
  options.scale = -2.f;
  expect_rejected(run({0, 4, 10}, {0, 6, 12}, options), "scale", out);
}

}  // namespace
}  // namespace ditops::test
