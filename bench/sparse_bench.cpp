// RainFusion and block-sparse attention beside dense flash attention in the same process, on a
// Wan-like layout that fits a small machine: 12 x 16 x 32 latent tokens + 128 text tokens
// (S = 6272), N = 4 heads, D = 128, fp32, BSND. q and k carry a smooth (t, h, w) positional
// component on top of noise, so attention is local as in a video DiT and the classifier and the
// accuracy figures mean something.
// Cases (range "case"; dense:1 case:0 is the baseline bench-summary pairs every case with):
//   1-3 every head spatial at sparsity 0.5 / 0.75 / 0.9; 4-6 every head temporal, same; 7 every
//   head textural (stride 2); 8 mixed patterns (spatial, temporal, textural, spatial) at 0.75;
//   9 block_sparse_attention with 25 % of the 64-blocks kept (random, text blocks dense);
//   10 rainfusion_classify alone.
// Counters: kept = share of the S x S scores the case computes (time / dense time should be
// close to it), rel_l2_vs_dense = relative L2 distance of the output to dense attention's.

#include <cmath>
#include <ditops/attention.hpp>
#include <ditops/runtime.hpp>
#include <ditops/sparse.hpp>

#include "bench/support.hpp"

namespace ditops::bench {
namespace {

constexpr std::int64_t kFrames = 12, kHeight = 16, kWidth = 32, kText = 128, kHeads = 4, kDim = 128;
constexpr std::int64_t kTokens = kText + kFrames * kHeight * kWidth;

RainFusionOptions layout_options(float sparsity) {
  RainFusionOptions rf;
  rf.video = {kFrames, kHeight, kWidth, kText, true};
  rf.sparsity = sparsity;
  return rf;
}

/// q or k, [1, S, N, D]: N(0, 1) noise plus, on the first half of the channels, sines of the
/// token's (t, h, w) at a few frequencies (scaled so neighbours score higher than strangers).
std::vector<float> positional_tensor(unsigned seed) {
  std::vector<float> data(kTokens * kHeads * kDim);
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.f, 1.f);
  for (auto& x : data) x = noise(rng);
  for (std::int64_t token = kText; token < kTokens; ++token) {
    const std::int64_t video = token - kText;
    const double coords[3] = {double(video / (kHeight * kWidth)), double(video / kWidth % kHeight),
                              double(video % kWidth)};
    for (std::int64_t head = 0; head < kHeads; ++head) {
      float* row = data.data() + (token * kHeads + head) * kDim;
      for (std::int64_t c = 0; c < kDim / 2; ++c) {
        const double frequency = 0.15 * (1 + c / 6 % 4), phase = coords[c % 3] * frequency;
        row[c] += static_cast<float>(2.5 * (c % 2 ? std::sin(phase) : std::cos(phase)));
      }
    }
  }
  return data;
}

double relative_l2(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return std::sqrt(diff / norm);
}

/// Share of the S x S scores a head of `pattern` keeps (text rows and columns included).
double kept_share(HeadPattern pattern, const RainFusionOptions& rf) {
  const double video = kTokens - kText, all = double(kTokens) * kTokens;
  const double text_scores = all - video * video;
  return (text_scores + rainfusion_density(pattern, rf) * video * video) / all;
}

void BM_sparse_attention(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int kase = static_cast<int>(state.range(1));
  set_num_threads(threads);
  const std::vector<float> q = positional_tensor(1), k = positional_tensor(2);
  std::vector<float> v(q.size());
  std::mt19937 rng(3);
  std::normal_distribution<float> noise;
  for (auto& x : v) x = noise(rng);
  std::vector<float> out(q.size()), dense(q.size());
  const auto qv = view(q.data(), {1, kTokens, kHeads, kDim});
  const auto kv = view(k.data(), {1, kTokens, kHeads, kDim});
  const auto vv = view(v.data(), {1, kTokens, kHeads, kDim});
  const auto ov = view(out.data(), {1, kTokens, kHeads, kDim});
  AttentionOptions flash;
  flash.backend = AttentionBackend::flash;

  const float sparsities[] = {0.5f, 0.75f, 0.9f};
  const HeadPattern cycle[] = {HeadPattern::spatial, HeadPattern::temporal, HeadPattern::textural,
                               HeadPattern::spatial};
  RainFusionOptions rf = layout_options(0.75f);
  std::vector<HeadPattern> patterns(kHeads, HeadPattern::dense);
  std::string label = "dense flash";
  double kept = 1;
  const std::int64_t blocks = (kTokens + 63) / 64;
  std::vector<std::uint8_t> block_mask;
  if (kase >= 1 && kase <= 7) {
    const HeadPattern pattern = kase <= 3   ? HeadPattern::spatial
                                : kase <= 6 ? HeadPattern::temporal
                                            : HeadPattern::textural;
    if (kase <= 6) rf = layout_options(sparsities[(kase - 1) % 3]);
    patterns.assign(kHeads, pattern);
    kept = kept_share(pattern, rf);
    label = std::string("rainfusion ") + pattern_name(pattern) +
            (kase <= 6 ? " sparsity " + std::to_string(rf.sparsity).substr(0, 4) : " stride 2");
  } else if (kase == 8) {
    patterns.assign(cycle, cycle + kHeads);
    kept = 0;
    for (HeadPattern pattern : patterns) kept += kept_share(pattern, rf) / kHeads;
    label = "rainfusion mixed sparsity 0.75";
  } else if (kase == 9) {
    block_mask.assign(blocks * blocks, 0);
    std::bernoulli_distribution keep(0.25);
    std::int64_t kept_blocks = 0;
    for (std::int64_t i = 0; i < blocks; ++i) {
      for (std::int64_t j = 0; j < blocks; ++j) {
        block_mask[i * blocks + j] = i < 2 || j < 2 || keep(rng);  // text blocks dense
        kept_blocks += block_mask[i * blocks + j];
      }
    }
    kept = double(kept_blocks) / double(blocks * blocks);
    label = "block_sparse 64-blocks";
  } else if (kase == 10) {
    label = "rainfusion_classify";
    kept = 0;
  }
  TensorView mask_view = view(block_mask.data(), {1, blocks, blocks});
  mask_view.dtype = DType::boolean;
  auto run = [&] {
    if (kase == 0) {
      attention_forward(qv, kv, vv, ov, flash);
    } else if (kase == 9) {
      block_sparse_attention(qv, kv, vv, mask_view, 64, ov);
    } else if (kase == 10) {
      benchmark::DoNotOptimize(rainfusion_classify(qv, kv, rf));
    } else {
      rainfusion_attention(qv, kv, vv, patterns, ov, rf);
    }
  };
  run();  // plans and packs once outside the timed loop, as a denoising loop would
  for (auto _ : state) {
    run();
    benchmark::ClobberMemory();
  }
  if (kase != 0 && kase != 10) {
    attention_forward(qv, kv, vv, view(dense.data(), {1, kTokens, kHeads, kDim}), flash);
    state.counters["rel_l2_vs_dense"] = relative_l2(out, dense);
  }
  if (kase == 10) {
    const auto classes = rainfusion_classify(qv, kv, rf);
    for (std::size_t h = 0; h < classes.size(); ++h) {
      label += std::string(h ? "," : " ") + pattern_name(classes[h]);
    }
  }
  state.counters["kept"] = kept;
  state.SetLabel(label);
  const double flops = 4.0 * kHeads * double(kTokens) * kTokens * kDim * (kase == 10 ? 0 : kept);
  if (kase != 10) report_flops(state, flops, measured_limits(threads).fma_flops, threads);
}

void sparse_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"threads", "case", "dense"})->Unit(benchmark::kMillisecond)->UseRealTime();
  for (int threads : {1, 2}) {
    b->Args({threads, 0, 1});
    for (int kase = 1; kase <= 10; ++kase) b->Args({threads, kase, 0});
  }
}

BENCHMARK(BM_sparse_attention)->Name("sparse_attention")->Apply(sparse_args);

}  // namespace
}  // namespace ditops::bench
