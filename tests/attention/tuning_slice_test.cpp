// The slice of a call the attention tuner times its candidates on (ops/attention/tuning_slice):
// its stated share of the work is the share it runs, running it writes exactly the rows (out and
// LSE) it covers and they are the call's own rows, and large calls are cut finely enough that
// tuning stays within a quarter of one call.

#include "ops/attention/tuning_slice.hpp"

#include <algorithm>
#include <cmath>
#include <ditops/attention.hpp>
#include <ditops/runtime.hpp>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "ops/attention/backends.hpp"
#include "tests/support/test_tensor.hpp"

namespace ditops::test {
namespace {

using attention::Call;
using attention::Config;
using attention::TuningSlice;

void check_slice(const Call& call, double share, int threads, TestTensor<float>& out,
                 TestTensor<float>& lse, const std::string& what) {
  SCOPED_TRACE(what + ", share " + std::to_string(share) + ", " + std::to_string(threads) +
               " threads, isa " + active_isa_name());
  set_num_threads(threads);
  // The whole call with the tuner's first candidate: every row's expected values.
  const Config config = attention::tuning_candidates(call).front();
  attention::find_backend(config.backend)->run(call, config, threads);
  std::vector<double> full_out(static_cast<std::size_t>(out.size())),
      full_lse(static_cast<std::size_t>(lse.size()));
  for (std::int64_t e = 0; e < out.size(); ++e) full_out[e] = out.value(e);
  for (std::int64_t e = 0; e < lse.size(); ++e) full_lse[e] = lse.value(e);

  const TuningSlice slice(call, share);
  const double total = attention::visited_pairs(call.problem);
  EXPECT_NEAR(slice.fraction(), attention::visited_pairs(slice.call().problem) / total, 1e-12);
  EXPECT_GT(slice.fraction(), 0.);
  EXPECT_LE(slice.fraction(), 1.);

  // Run the slice over canaries: the rows it writes are the call's rows, and the rows it does not
  // cover keep their canaries. The LSE tells which rows it covered (every row has one).
  for (std::int64_t e = 0; e < out.size(); ++e) out.at(e) = canary<float>();
  for (std::int64_t e = 0; e < lse.size(); ++e) lse.at(e) = canary<float>();
  attention::find_backend(config.backend)->run(slice.call(), config, threads);
  EXPECT_EQ(out.damaged_canaries() + lse.damaged_canaries(), 0);
  const auto written = [](const TestTensor<float>& t, std::int64_t e) {
    return !same_bits(t.at(e), canary<float>());
  };
  const std::int64_t dv = call.problem.dv;
  std::int64_t rows_written = 0;
  for (std::int64_t row = 0; row < lse.size(); ++row) {
    if (!written(lse, row)) continue;
    ++rows_written;
    if (lse.value(row) == full_lse[row]) continue;  // also a fully masked row's -inf
    ASSERT_NEAR(lse.value(row), full_lse[row], 1e-5 + 1e-5 * std::fabs(full_lse[row])) << row;
  }
  EXPECT_GT(rows_written, 0);
  // out rows follow lse's [B, N, S] / [N, T] rows: count out rows written and compare values.
  std::int64_t out_written = 0;
  for (std::int64_t e = 0; e < out.size(); ++e) {
    if (!written(out, e)) continue;
    ++out_written;
    ASSERT_NEAR(out.value(e), full_out[e], 1e-5 + 1e-5 * std::fabs(full_out[e])) << e;
  }
  EXPECT_EQ(out_written, rows_written * dv);
  // Rows written in proportion to the work of a non-causal dense call's share (every row sees
  // every key).
  if (!call.problem.causal && call.problem.cu_q == nullptr) {
    EXPECT_NEAR(static_cast<double>(rows_written) / static_cast<double>(lse.size()),
                slice.fraction(), 1e-9);
  }
}

TEST(AttentionTuningSlice, DenseSlicesRunTheirShareAndWriteOnlyTheirRows) {
  std::mt19937 rng(60);
  struct Shape {
    std::int64_t batch, sq, sk, heads, kv_heads;
    bool causal, mask;
  };
  for (const Shape& s :
       {Shape{1, 700, 700, 8, 8, false, false}, Shape{2, 300, 500, 6, 2, true, false},
        Shape{3, 130, 90, 4, 1, false, true}, Shape{1, 2000, 2000, 2, 2, true, true},
        Shape{2, 1, 600, 8, 8, false, false}}) {
    const std::int64_t d = 40;
    TestTensor<float> q({s.batch, s.sq, s.heads, d}), k({s.batch, s.sk, s.kv_heads, d}),
        v({s.batch, s.sk, s.kv_heads, d}), out({s.batch, s.sq, s.heads, d}),
        lse({s.batch, s.heads, s.sq});
    TestTensor<std::uint8_t> mask({s.batch, 1, s.sq, s.sk});
    q.fill_normal(rng);
    k.fill_normal(rng);
    v.fill_normal(rng);
    std::bernoulli_distribution keep(0.7);
    for (std::int64_t e = 0; e < mask.size(); ++e) mask.at(e) = keep(rng);
    AttentionOptions options;
    options.causal = s.causal;
    options.lse = lse.view();
    if (s.mask) options.attn_mask = as_bool(mask.view());
    const TensorView out_view = out.view();
    const Call call =
        attention::validate_dense("test", q.view(), k.view(), v.view(), &out_view, options);
    const std::string what = "b" + std::to_string(s.batch) + " sq" + std::to_string(s.sq) + " sk" +
                             std::to_string(s.sk) + " n" + std::to_string(s.heads) + "/" +
                             std::to_string(s.kv_heads) + (s.causal ? " causal" : "") +
                             (s.mask ? " mask" : "");
    for (const double share : {1.0, 0.5, 0.2, 0.04, 0.001}) {
      for (const int threads : {1, 2}) check_slice(call, share, threads, out, lse, what);
    }
  }
}

TEST(AttentionTuningSlice, VarlenSlicesRunTheirShareAndWriteOnlyTheirRows) {
  std::mt19937 rng(61);
  // Empty sequences first and inside, causal and not, GQA.
  const std::vector<std::int32_t> q_lens = {0, 300, 0, 41, 517, 7};
  const std::vector<std::int32_t> k_lens = {5, 350, 0, 41, 600, 12};
  std::vector<std::int32_t> cu_q(1, 0), cu_k(1, 0);
  for (std::size_t i = 0; i < q_lens.size(); ++i) {
    cu_q.push_back(cu_q.back() + q_lens[i]);
    cu_k.push_back(cu_k.back() + k_lens[i]);
  }
  const std::int64_t heads = 6, kv_heads = 3, d = 24;
  TestTensor<float> q({cu_q.back(), heads, d}), k({cu_k.back(), kv_heads, d}),
      v({cu_k.back(), kv_heads, d}), out({cu_q.back(), heads, d}), lse({heads, cu_q.back()});
  q.fill_normal(rng);
  k.fill_normal(rng);
  v.fill_normal(rng);
  for (const bool causal : {false, true}) {
    VarlenOptions options;
    options.causal = causal;
    options.lse = lse.view();
    const Call call =
        attention::validate_varlen(q.view(), k.view(), v.view(), cu_q, cu_k, out.view(), options);
    for (const double share : {1.0, 0.5, 0.3, 0.05, 0.001}) {
      for (const int threads : {1, 2}) {
        check_slice(call, share, threads, out, lse, causal ? "varlen causal" : "varlen");
      }
    }
  }
}

// The tuner's budget on the shapes DiTs run: the candidates' runs on the slice (3 each) stay
// within a quarter of the call's work, so a first call costs at most about 1.3 steady calls.
TEST(AttentionTuningSlice, LargeCallsAreCutWithinTheTuningBudget) {
  struct Shape {
    std::int64_t batch, seq, heads;
    bool causal;
  };
  for (const Shape& s :
       {Shape{1, 8192, 24, false}, Shape{1, 4608, 24, false}, Shape{2, 4096, 12, true},
        Shape{1, 32760, 12, false}, Shape{1, 16384, 1, true}}) {
    // The slice reads only the problem's geometry: no tensors needed.
    attention::Call call;
    call.problem.dtype = DType::f32;
    call.problem.dk = call.problem.dv = 128;
    call.problem.heads = call.problem.kv_heads = s.heads;
    call.problem.batch = s.batch;
    call.problem.q_len = call.problem.kv_len = s.seq;
    call.problem.causal = s.causal;
    for (const std::size_t candidates : {2, 3}) {
      const double runs = attention::kSliceRuns * static_cast<double>(candidates);
      const TuningSlice slice(call, attention::kTuningShare / runs);
      EXPECT_LE(slice.fraction() * runs, attention::kMaxTuningShare)
          << "b" << s.batch << " s" << s.seq << " n" << s.heads;
      EXPECT_GE(slice.fraction() * runs, 0.05)
          << "b" << s.batch << " s" << s.seq << " n" << s.heads;
    }
  }
}

}  // namespace
}  // namespace ditops::test
