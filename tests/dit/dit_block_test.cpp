// The DiT block example (examples/dit_block) against an fp64 block assembled from the operator
// references, CFG fused against two passes, and the guidance combine against its formula.
//
// The reference computes every operator in fp64 but rounds the values between operators to
// fp32, as the block's buffers do: the comparison then measures the kernels' arithmetic, not
// the storage precision, and a W8A8 reference layer quantizes (nearly always) the same fp32
// activations into the same integers (linear_ref.hpp's quantize_ref). Errors are measured on
// the block's update (output - input), not on the output: the residual stream passes through
// unchanged and would hide an error in the block's own contribution.

#include "dit_block.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ditops/guidance.hpp>
#include <ditops/instance.hpp>
#include <ditops/runtime.hpp>
#include <numbers>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/reference/attention_ref.hpp"
#include "tests/reference/linear_ref.hpp"
#include "tests/reference/norm_ref.hpp"
#include "tests/reference/rope_ref.hpp"
#include "tests/support/scoped_threads.hpp"

namespace ditops::test {
namespace {

using Values = std::vector<double>;

dit::DitBlockConfig small_config(dit::LinearKind linear, dit::AttentionKind attention) {
  dit::DitBlockConfig config;
  config.hidden = 64;
  config.heads = 4;
  config.head_dim = 16;
  config.image_tokens = 24;
  config.text_tokens = 8;
  config.linear = linear;
  config.attention = attention;
  config.seed = 7;
  return config;
}

/// Two sequences, the second with 3 of its 8 text tokens valid (the padding mask matters).
dit::CfgInput random_input(const dit::DitBlockConfig& config, std::uint32_t seed) {
  return dit::random_cfg_input(config, seed, 3);
}

/// `values` rounded to fp32 in a TestTensor of `shape`, as the operator references read them.
TestTensor<float> as_f32(const Values& values, std::vector<std::int64_t> shape) {
  TestTensor<float> t(std::move(shape));
  for (std::int64_t i = 0; i < t.size(); ++i) t.at(i) = static_cast<float>(values[i]);
  return t;
}

/// The layer on `rows` rows of x (rounded to fp32): W8A8 (dynamic per-token activations, the
/// integer weights) or FLOAT.
Values linear(const dit::LinearWeights& layer, const Values& x, std::int64_t rows, bool w8a8) {
  const std::vector<float> input(x.begin(), x.end());
  if (!w8a8) return float_matmul_ref(input, layer.weight, layer.bias, rows, layer.out, layer.in);
  RefQuant quant;
  quant.dynamic = true;
  std::vector<std::int32_t> q;
  std::vector<double> row_scale;
  quantize_ref(input, rows, layer.in, quant, q, row_scale);
  const auto acc = int_matmul_ref(q, layer.weight_q, rows, layer.out, layer.in);
  return epilogue_ref(acc, row_scale, layer.weight_scale,
                      std::vector<double>(static_cast<std::size_t>(layer.out), 0.0), layer.bias,
                      rows, layer.out, false)
      .expected;
}

double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

/// The block of dit_block.cpp, operator by operator, from the references.
Values reference_block(const dit::DitBlock& block, const dit::DitBlockWeights& w,
                       const dit::CfgInput& in) {
  const dit::DitBlockConfig& c = block.config();
  const bool w8a8 = c.linear == dit::LinearKind::w8a8;
  const std::int64_t batch = 2, seq = c.sequence(), hidden = c.hidden, rows = batch * seq;
  const std::int64_t heads = c.heads, dim = c.head_dim;
  const auto round_f32 = [](Values& v) {
    for (double& e : v) e = static_cast<float>(e);
  };

  Values activated(in.conditioning.begin(), in.conditioning.end());
  for (double& v : activated) v = v / (1 + std::exp(-v));
  round_f32(activated);
  Values modulation = linear(w.modulation, activated, batch, w8a8);
  round_f32(modulation);
  const auto mod = [&](std::int64_t row, int which, std::int64_t i) {
    return modulation[static_cast<std::size_t>(((row / seq) * 6 + which) * hidden + i)];
  };
  const auto modulate = [&](Values normed, int shift) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t i = 0; i < hidden; ++i) {
        double& v = normed[static_cast<std::size_t>(r * hidden + i)];
        v = v * (1 + mod(r, shift + 1, i)) + mod(r, shift, i);
      }
    }
    round_f32(normed);
    return normed;
  };
  const auto gate = [&](Values values, int which) {
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t i = 0; i < hidden; ++i) {
        values[static_cast<std::size_t>(r * hidden + i)] *= mod(r, which, i);
      }
    }
    round_f32(values);
    return values;
  };
  const Values x(in.x.begin(), in.x.end());
  const TestTensor<float> x_tensor = as_f32(x, {rows, hidden});

  // Attention half.
  const Values attn_in = modulate(norm_reference<float>(x_tensor, nullptr, {}, c.eps).out, 0);
  // q, k, v: [batch, S, heads, dim], each from its own (unfused) layer.
  std::vector<Values> qkv;
  const Values q_norm(w.q_norm.begin(), w.q_norm.end()), k_norm(w.k_norm.begin(), w.k_norm.end());
  for (const auto* layer : {&w.q, &w.k, &w.v}) qkv.push_back(linear(*layer, attn_in, rows, w8a8));
  const auto cos = [&](std::int64_t, std::int64_t s, std::int64_t, std::int64_t k) {
    return static_cast<double>(block.rope_cos()[static_cast<std::size_t>(s * dim + k)]);
  };
  const auto sin = [&](std::int64_t, std::int64_t s, std::int64_t, std::int64_t k) {
    return static_cast<double>(block.rope_sin()[static_cast<std::size_t>(s * dim + k)]);
  };
  for (int part = 0; part < 2; ++part) {
    const Values normed = norm_reference<float>(as_f32(qkv[part], {rows * heads, dim}), nullptr,
                                                part == 0 ? q_norm : k_norm, c.eps)
                              .out;
    qkv[part] = rope_reference<float>(as_f32(normed, {batch, seq, heads, dim}), true, cos, sin);
  }
  for (Values& part : qkv) round_f32(part);
  AttentionRefProblem p;
  p.batch = batch;
  p.q_len = p.kv_len = seq;
  p.heads = p.kv_heads = heads;
  p.dk = p.dv = dim;
  p.scale = 1 / std::sqrt(static_cast<double>(dim));
  const auto reader = [&](const Values& t) {
    return [&t, seq, heads, dim](std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
      return t[static_cast<std::size_t>(((b * seq + s) * heads + h) * dim + d)];
    };
  };
  p.q = reader(qkv[0]);
  p.k = reader(qkv[1]);
  p.v = reader(qkv[2]);
  p.allowed = [&](std::int64_t b, std::int64_t, std::int64_t, std::int64_t key) {
    return key >= c.text_tokens - in.text_lengths[static_cast<std::size_t>(b)];
  };
  Values attended = attention_reference(p).out;
  round_f32(attended);
  Values projected = linear(w.out, attended, rows, w8a8);
  round_f32(projected);
  const TestTensor<float> gated = as_f32(gate(projected, 2), {rows, hidden});
  const NormReference residual = norm_reference(x_tensor, &gated, {}, c.eps);

  // MLP half.
  Values up = linear(w.mlp_up, modulate(residual.out, 3), rows, w8a8);
  for (double& v : up) v = gelu_tanh(static_cast<float>(v));
  round_f32(up);
  Values down = linear(w.mlp_down, up, rows, w8a8);
  round_f32(down);
  const Values mlp_out = gate(down, 5);
  Values out(static_cast<std::size_t>(rows * hidden));
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<float>(residual.sum[i]) + mlp_out[i];
  }
  return out;
}

struct Agreement {
  double max_error = 0;  ///< largest |update - reference update| / max |reference update|
  double cosine = 0;     ///< of the updates
};

/// The block's update (output - input) against the reference's, over the rows `compare` keeps.
template <class Keep>
Agreement agreement(const std::vector<float>& got, const Values& want, const dit::CfgInput& in,
                    std::int64_t hidden, const Keep& compare) {
  double top = 0, dot = 0, got2 = 0, want2 = 0, worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!compare(static_cast<std::int64_t>(i) / hidden)) continue;
    const double g = static_cast<double>(got[i]) - in.x[i], w = want[i] - in.x[i];
    top = std::max(top, std::fabs(w));
    worst = std::max(worst, std::fabs(g - w));
    dot += g * w;
    got2 += g * g;
    want2 += w * w;
  }
  return {worst / top, dot / std::sqrt(got2 * want2)};
}

struct BlockCase {
  dit::LinearKind linear;
  dit::AttentionKind attention;
  int threads;
};

std::string describe(const BlockCase& c) {
  return std::string(dit::linear_kind_name(c.linear)) + " linears, " +
         dit::attention_kind_name(c.attention) + " attention, " + std::to_string(c.threads) +
         " threads, isa " + cpu_info().isa;
}

// Bounds, on the update relative to its largest magnitude:
// - FLOAT linears + flash (and RainFusion, dense at one frame): every operator computes in fp32
//   from the same fp32 inputs as the reference, so the error is one operator's rounding (sums
//   of K <= 256 fp32 products, ~K 2^-24 of the terms' magnitudes) carried through the linears
//   after it: measured 3.8e-7 to 5.4e-7 on the scalar, SSE4.2 and AVX2 kernels; 1e-5.
// - W8A8 linears + flash: the same integers wherever the block's and the reference's fp32
//   activations round alike (measured 3.0e-7 to 3.9e-7: no integer differed). Where an fp32
//   difference (~1e-6 relative) moves a value across a rounding boundary, that integer moves by
//   one step (max|x_row| / 127) and its products with it: a fraction of the 1e-2 quantization
//   step of the update; 2e-3 allows a few such flips.
// - int8 attention: lossy by design (tests/attention/int8_test.cpp: cosine >= 0.999 of the
//   attention output); through the out-projection and the MLP the update keeps cosine >= 0.999
//   against the exact-attention reference (measured >= 0.99993), and differs from it by more
//   than fp32 rounding (measured 3e-3 and more), which shows the int8 backend ran.
constexpr double kFloatFlash = 1e-5;
constexpr double kW8a8Flash = 2e-3;
constexpr double kInt8Cosine = 0.999;
constexpr double kInt8MinError = 1e-4;

class DitBlockReference : public ::testing::TestWithParam<BlockCase> {};

TEST_P(DitBlockReference, MatchesTheOperatorReferences) {
  const BlockCase bc = GetParam();
  const ScopedThreads threads(bc.threads);
  const dit::DitBlockConfig config = small_config(bc.linear, bc.attention);
  const dit::DitBlockWeights weights = dit::make_synthetic_weights(config);
  const dit::DitBlock block(config, weights);
  const dit::CfgInput in = random_input(config, 11);
  std::vector<float> got = in.x;
  block.forward(got, in.conditioning, in.text_lengths);
  const Values want = reference_block(block, weights, in);
  // RainFusion skips the padding rows (they stay zero); the others compute them too.
  const auto keep = [&](std::int64_t row) {
    if (bc.attention != dit::AttentionKind::rainfusion) return true;
    const std::int64_t b = row / config.sequence(), s = row % config.sequence();
    return s >= config.text_tokens - in.text_lengths[static_cast<std::size_t>(b)];
  };
  const Agreement a = agreement(got, want, in, config.hidden, keep);
  std::printf("dit block %s: max error %.3g of max |update|, cosine %.8f\n", describe(bc).c_str(),
              a.max_error, a.cosine);
  if (bc.attention == dit::AttentionKind::int8) {
    EXPECT_GE(a.cosine, kInt8Cosine) << describe(bc);
    EXPECT_GT(a.max_error, kInt8MinError) << describe(bc);
  } else {
    EXPECT_LE(a.max_error, bc.linear == dit::LinearKind::fp32 ? kFloatFlash : kW8a8Flash)
        << describe(bc);
  }
}

const BlockCase kBlockCases[] = {
    {dit::LinearKind::fp32, dit::AttentionKind::flash, 1},
    {dit::LinearKind::fp32, dit::AttentionKind::flash, 2},
    {dit::LinearKind::w8a8, dit::AttentionKind::flash, 2},
    {dit::LinearKind::fp32, dit::AttentionKind::int8, 2},
    {dit::LinearKind::w8a8, dit::AttentionKind::int8, 2},
    {dit::LinearKind::fp32, dit::AttentionKind::rainfusion, 2},
};
INSTANTIATE_TEST_SUITE_P(Cases, DitBlockReference, ::testing::ValuesIn(kBlockCases));

// CFG fused (one batch of two) against two batch-1 passes, bit for bit: every operator of the
// block computes a row (a token, or a (sequence, head) for attention) from that row's inputs
// alone, in an order that does not depend on the batch: W8A8 sums exact int32 products; the
// FLOAT GEMM tiles rows x output panels and reduces each output over the whole K in one task;
// norms and RoPE are per row; attention runs one task per (sequence, head, query block) over
// all of its keys. The exception is attention's split-KV, taken only when a call has fewer
// tasks than 2 x threads (decode-like shapes): there a batch-1 pass may split its keys where
// the fused batch does not, and the two agree to fp32 rounding only. A DiT's (heads x query
// blocks) is far above that, and so is this test's 4 heads at 2 threads.
class DitBlockCfg : public ::testing::TestWithParam<BlockCase> {};

TEST_P(DitBlockCfg, FusedEqualsTwoPassesAndTheCombineItsFormula) {
  const BlockCase bc = GetParam();
  const ScopedThreads threads(bc.threads);
  const dit::DitBlockConfig config = small_config(bc.linear, bc.attention);
  const dit::DitBlock block(config, dit::make_synthetic_weights(config));
  const dit::CfgInput in = random_input(config, 12);
  const std::size_t tokens = in.x.size() / 2;
  constexpr float kScale = 3.5f;
  std::vector<float> fused = in.x, two_pass = in.x;
  std::vector<float> guided_fused(tokens), guided_two_pass(tokens);
  dit::run_cfg(block, 2, dit::CfgMode::fused, kScale, fused, in.conditioning, in.text_lengths,
               guided_fused);
  dit::run_cfg(block, 2, dit::CfgMode::two_pass, kScale, two_pass, in.conditioning, in.text_lengths,
               guided_two_pass);
  EXPECT_EQ(std::memcmp(fused.data(), two_pass.data(), fused.size() * sizeof(float)), 0)
      << describe(bc);
  EXPECT_EQ(std::memcmp(guided_fused.data(), guided_two_pass.data(), tokens * sizeof(float)), 0)
      << describe(bc);
  // uncond + scale (cond - uncond) in fp32: three roundings of terms no larger than |uncond| +
  // |scale (cond - uncond)|; 4 ulps of that bound.
  std::int64_t wrong = 0;
  for (std::size_t i = 0; i < tokens; ++i) {
    const double cond = fused[i], uncond = fused[tokens + i];
    const double want = uncond + kScale * (cond - uncond);
    const double bound = 4 * 0x1p-24 * (std::fabs(uncond) + std::fabs(kScale * (cond - uncond)));
    wrong += !(std::fabs(guided_fused[i] - want) <= bound);
  }
  EXPECT_EQ(wrong, 0) << describe(bc);
}

const BlockCase kCfgCases[] = {
    {dit::LinearKind::fp32, dit::AttentionKind::flash, 1},
    {dit::LinearKind::fp32, dit::AttentionKind::flash, 2},
    {dit::LinearKind::w8a8, dit::AttentionKind::flash, 2},
    {dit::LinearKind::w8a8, dit::AttentionKind::int8, 2},
    {dit::LinearKind::w8a8, dit::AttentionKind::rainfusion, 2},
};
INSTANTIATE_TEST_SUITE_P(Cases, DitBlockCfg, ::testing::ValuesIn(kCfgCases));

// Two instances, each running the block on its own input from its own run(), concurrently,
// give what they give one at a time: they share the packed weights read-only and nothing else
// (each call allocates its activations, each instance has its own threads and scratch).
TEST(DitBlockInstances, ConcurrentEqualsOneAtATimeOnDisjointCores) {
  if (cpu_info().physical_cores < 2) GTEST_SKIP() << "one physical core: no second instance";
  const std::vector<Instance> instances = Instance::partition(2);
  ASSERT_EQ(instances.size(), 2u);
  std::set<int> cores;
  for (const Instance& instance : instances) {
    for (int core : instance.cores()) EXPECT_TRUE(cores.insert(core).second) << "core " << core;
  }
  const dit::DitBlockConfig config = small_config(dit::LinearKind::w8a8, dit::AttentionKind::flash);
  const dit::DitBlock block(config, dit::make_synthetic_weights(config));
  std::vector<dit::CfgInput> inputs = {random_input(config, 21), random_input(config, 22)};
  const auto run_on = [&](std::size_t i, std::vector<float>& x) {
    instances[i].run([&] {
      for (int step = 0; step < 3; ++step) {
        block.forward(x, inputs[i].conditioning, inputs[i].text_lengths);
      }
    });
  };
  std::vector<std::vector<float>> alone = {inputs[0].x, inputs[1].x};
  for (std::size_t i = 0; i < 2; ++i) run_on(i, alone[i]);
  std::vector<std::vector<float>> together = {inputs[0].x, inputs[1].x};
  std::thread second([&] { run_on(1, together[1]); });
  run_on(0, together[0]);
  second.join();
  for (std::size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(std::memcmp(alone[i].data(), together[i].data(), alone[i].size() * sizeof(float)), 0)
        << "instance " << i;
  }
}

TEST(DitBlockConfig, InconsistentShapesAreErrors) {
  dit::DitBlockConfig config = small_config(dit::LinearKind::fp32, dit::AttentionKind::flash);
  config.heads = 5;
  EXPECT_THROW(config.validate(), Error);
  config = small_config(dit::LinearKind::fp32, dit::AttentionKind::flash);
  config.frames = 5;
  EXPECT_THROW(dit::make_synthetic_weights(config), Error);
  config.frames = 1;
  const dit::DitBlock block(config, dit::make_synthetic_weights(config));
  dit::CfgInput in = random_input(config, 13);
  in.text_lengths = {config.text_tokens + 1, 0};
  EXPECT_THROW(block.forward(in.x, in.conditioning, in.text_lengths), Error);
  in.text_lengths = {1};
  EXPECT_THROW(block.forward(in.x, in.conditioning, in.text_lengths), Error);
}

}  // namespace
}  // namespace ditops::test
