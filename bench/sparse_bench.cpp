// RainFusion and block-sparse attention beside dense flash attention in the same process, on a
// Wan-like layout that fits a small machine: 12 x 16 x 32 latent tokens + 128 text tokens
// (S = 6272), N = 4 heads, D = 128, fp32, BSND. q and k are planted per head (planted_tensor)
// so each head follows the pattern the case runs, as the heads RainFusion classifies do: the
// accuracy figures then say what a pattern loses on a head that follows it.
// Cases (range "case"; dense:1 case:0 is the baseline bench-summary pairs every case with):
//   1-3 every head spatial at sparsity 0.5 / 0.75 / 0.9; 4-6 every head temporal, same; 7 every
//   head textural (stride 2); 8 heads planted spatial, temporal, textural, spatial, classified
//   and run by one rainfusion_attention call (patterns empty) at 0.75; 9 block_sparse_attention
//   with 25 % of each query block's 64-key blocks kept (random); 10 rainfusion_classify alone
//   on case 8's data (the label lists the patterns it found).
// Counters: kept = share of the S x S scores the case computes (time / dense time should be
// close to it), rel_l2_vs_dense = relative L2 distance of the output to dense attention's.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ditops/attention.hpp>
#include <ditops/runtime.hpp>
#include <ditops/sparse.hpp>
#include <numeric>

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

/// q or k, [1, S, N, D]: N(0, 1) noise plus, for a video token of a head planted as spatial
/// (temporal), a random direction of norm 11 shared by the tokens of its frame (its (h, w)
/// column): a score within the group is ~10 above one outside, so nearly all of a row's mass
/// stays in the group, as in the heads RainFusion describes. Textural (and dense) heads get
/// noise only: near-uniform attention.
std::vector<float> planted_tensor(unsigned seed, const std::vector<HeadPattern>& kinds) {
  std::vector<float> data(kTokens * kHeads * kDim);
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.f, 1.f);
  for (auto& x : data) x = noise(rng);
  std::mt19937 directions_rng(7);  // the same directions for q and k
  const std::int64_t groups = std::max(kFrames, kHeight * kWidth);
  std::vector<float> directions(kHeads * groups * kDim);
  for (std::int64_t g = 0; g < kHeads * groups; ++g) {
    double norm = 0;
    for (std::int64_t c = 0; c < kDim; ++c) {
      directions[g * kDim + c] = noise(directions_rng);
      norm += double(directions[g * kDim + c]) * directions[g * kDim + c];
    }
    for (std::int64_t c = 0; c < kDim; ++c) directions[g * kDim + c] *= 11.f / std::sqrt(norm);
  }
  for (std::int64_t token = kText; token < kTokens; ++token) {
    const std::int64_t video = token - kText;
    for (std::int64_t head = 0; head < kHeads; ++head) {
      const HeadPattern kind = kinds[head];
      if (kind != HeadPattern::spatial && kind != HeadPattern::temporal) continue;
      const std::int64_t group =
          kind == HeadPattern::spatial ? video / (kHeight * kWidth) : video % (kHeight * kWidth);
      const float* direction = directions.data() + (head * groups + group) * kDim;
      float* row = data.data() + (token * kHeads + head) * kDim;
      for (std::int64_t c = 0; c < kDim; ++c) row[c] += direction[c];
    }
  }
  return data;
}

double relative_l2(const PlacedBuffer<float>& got, const std::vector<float>& want) {
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
  const bool misaligned = state.range(3) != 0;
  set_num_threads(threads);
  const float sparsities[] = {0.5f, 0.75f, 0.9f};
  const HeadPattern cycle[] = {HeadPattern::spatial, HeadPattern::temporal, HeadPattern::textural,
                               HeadPattern::spatial};
  RainFusionOptions rf = layout_options(0.75f);
  // What the data is planted as (per head) and the patterns the case runs (empty: classify).
  std::vector<HeadPattern> kinds(cycle, cycle + kHeads), patterns;
  std::string label = "dense flash";
  double kept = 1;
  const std::int64_t blocks = (kTokens + 63) / 64;
  std::vector<std::uint8_t> block_mask;
  std::mt19937 rng(3);
  if (kase >= 1 && kase <= 7) {
    const HeadPattern pattern = kase <= 3   ? HeadPattern::spatial
                                : kase <= 6 ? HeadPattern::temporal
                                            : HeadPattern::textural;
    if (kase <= 6) rf = layout_options(sparsities[(kase - 1) % 3]);
    patterns.assign(kHeads, pattern);
    kinds.assign(kHeads, pattern);
    kept = kept_share(pattern, rf);
    label = std::string("rainfusion ") + pattern_name(pattern) +
            (kase <= 6 ? " sparsity " + std::to_string(rf.sparsity).substr(0, 4) : " stride 2");
  } else if (kase == 8) {
    kept = 0;
    for (HeadPattern pattern : kinds) kept += kept_share(pattern, rf) / kHeads;
    label = "rainfusion classified+run sparsity 0.75";
  } else if (kase == 9) {
    // Exactly a quarter of each query block's key blocks, at random.
    block_mask.assign(blocks * blocks, 0);
    std::vector<std::int64_t> columns(blocks);
    for (std::int64_t i = 0; i < blocks; ++i) {
      std::iota(columns.begin(), columns.end(), 0);
      std::shuffle(columns.begin(), columns.end(), rng);
      for (std::int64_t j = 0; j < blocks / 4; ++j) block_mask[i * blocks + columns[j]] = 1;
    }
    kept = double(blocks / 4) / double(blocks);
    label = "block_sparse 64-blocks";
  } else if (kase == 10) {
    label = "rainfusion_classify";
    kept = 0;
  }
  const std::int64_t elements = kTokens * kHeads * kDim;
  PlacedBuffer<float> q(elements, misaligned), k(elements, misaligned), v(elements, misaligned),
      out(elements, misaligned);
  std::vector<float> dense(q.size());
  const std::vector<float> q_planted = planted_tensor(1, kinds),
                           k_planted = planted_tensor(2, kinds);
  std::copy(q_planted.begin(), q_planted.end(), q.data());
  std::copy(k_planted.begin(), k_planted.end(), k.data());
  std::normal_distribution<float> noise;
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = noise(rng);
  const auto qv = view(q.data(), {1, kTokens, kHeads, kDim});
  const auto kv = view(k.data(), {1, kTokens, kHeads, kDim});
  const auto vv = view(v.data(), {1, kTokens, kHeads, kDim});
  const auto ov = view(out.data(), {1, kTokens, kHeads, kDim});
  AttentionOptions flash;
  flash.backend = AttentionBackend::flash;
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
  if (kase != 10) {
    char text[96];
    std::snprintf(text, sizeof text, ", kept %.3f of the scores", kept);
    label += text;
  }
  if (kase != 0 && kase != 10) {
    attention_forward(qv, kv, vv, view(dense.data(), {1, kTokens, kHeads, kDim}), flash);
    state.counters["rel_l2_vs_dense"] = relative_l2(out, dense);
    char text[64];
    std::snprintf(text, sizeof text, ", rel. L2 vs dense %.4f", relative_l2(out, dense));
    label += text;
  }
  if (kase == 10) {
    const auto classes = rainfusion_classify(qv, kv, rf);
    for (std::size_t h = 0; h < classes.size(); ++h) {
      label += std::string(h ? "," : " ") + pattern_name(classes[h]);
    }
  }
  state.counters["kept"] = kept;
  state.SetLabel(label + placement_label(misaligned));
  const double flops = 4.0 * kHeads * double(kTokens) * kTokens * kDim * (kase == 10 ? 0 : kept);
  if (kase != 10) report_flops(state, flops, measured_limits(threads).fma_flops, threads);
}

// misaligned = 1: q, k, v and out 16 bytes past a cache line, as allocators put them (dense,
// RainFusion spatial 0.75 and block-sparse, beside their aligned rows).
void sparse_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"threads", "case", "dense", "misaligned"})
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  for (int threads : {1, 2}) {
    b->Args({threads, 0, 1, 0});
    for (int kase = 1; kase <= 10; ++kase) b->Args({threads, kase, 0, 0});
    b->Args({threads, 0, 1, 1});
    for (int kase : {2, 9}) b->Args({threads, kase, 0, 1});
  }
}

BENCHMARK(BM_sparse_attention)->Name("sparse_attention")->Apply(sparse_args);

}  // namespace
}  // namespace ditops::bench
