// RainFusion and block-sparse attention over their argument space: video layouts (text before
// or after the video, frame 0 dense or not, sparsity, textural stride, recall threshold, extents
// down to 1 and up to overflow), per-head patterns (invalid values too), block masks of 64 and
// 128 with any broadcast, attn_mask and causal on top, GQA, dtypes. Accepted attention calls are
// checked against the fp64 reference with the mask they stand for (rainfusion_mask for a
// pattern, the block mask expanded to tokens).

#include <ditops/sparse.hpp>

#include "fuzz/support.hpp"
#include "tests/reference/attention_ref.hpp"

namespace ditops::fuzz {
namespace {

RainFusionOptions pick_layout(Input& in) {
  RainFusionOptions rf;
  if (in.rarely(16)) {  // extents that overflow or are not positive
    rf.video = {in.pick<std::int64_t>({0, -1, 1 << 20, std::int64_t{1} << 40}),
                in.pick<std::int64_t>({1, 1 << 16, std::int64_t{1} << 40}), in.size(1, 3),
                in.pick<std::int64_t>({0, -1, 1 << 30}), in.flag()};
  } else {
    rf.video = {in.size(1, 4), in.size(1, 4), in.size(1, 4), in.size(0, 9), in.flag()};
  }
  rf.sparsity = in.rarely(8) ? in.edge_float(0.5f) : in.pick({0.f, 0.5f, 0.64f, 0.9f});
  rf.textural_stride =
      in.rarely(16) ? static_cast<int>(in.size(-1, 0)) : static_cast<int>(in.size(1, 3));
  rf.recall_threshold = in.rarely(8) ? in.edge_float(0.95f) : 0.95f;
  rf.dense_first_frame = in.flag();
  return rf;
}

std::int64_t tokens_of(const RainFusionOptions& rf) {
  const VideoLayout& v = rf.video;
  return v.text_tokens + v.frames * v.height * v.width;
}

bool layout_valid(const RainFusionOptions& rf) {
  const VideoLayout& v = rf.video;
  return v.frames >= 1 && v.height >= 1 && v.width >= 1 && v.text_tokens >= 0 && v.frames <= 64 &&
         v.height <= 64 && v.width <= 64 && v.text_tokens <= 64;
}

struct Problem {
  std::int64_t b, n, kv_heads, s, dk, dv;
};

/// The fp64 reference of self-attention with `allowed` as the boolean mask, as [B, S, N, Dv].
template <class T>
std::vector<double> reference(
    const Problem& pr, const TestTensor<T>& q, const TestTensor<T>& k, const TestTensor<T>& v,
    float scale,
    std::function<bool(std::int64_t, std::int64_t, std::int64_t, std::int64_t)> allowed) {
  test::AttentionRefProblem p;
  p.batch = pr.b;
  p.q_len = p.kv_len = pr.s;
  p.heads = pr.n;
  p.kv_heads = pr.kv_heads;
  p.dk = pr.dk;
  p.dv = pr.dv;
  p.scale = scale;
  p.q = [&](auto b, auto s, auto h, auto d) {
    return q.value(((b * pr.s + s) * pr.n + h) * pr.dk + d);
  };
  p.k = [&](auto b, auto s, auto h, auto d) {
    return k.value(((b * pr.s + s) * pr.kv_heads + h) * pr.dk + d);
  };
  p.v = [&](auto b, auto s, auto h, auto d) {
    return v.value(((b * pr.s + s) * pr.kv_heads + h) * pr.dv + d);
  };
  p.allowed = std::move(allowed);
  return test::attention_reference(p).out;
}

template <class T>
void sparse(Input& in) {
  const RainFusionOptions rf = pick_layout(in);
  const bool small = layout_valid(rf);
  // Tensors hold S tokens when the layout is small, else a few (the call must refuse them).
  const std::int64_t s = small && !in.rarely(16) ? tokens_of(rf) : in.size(0, 8);
  const std::int64_t kv_heads = in.size(1, 2), n = kv_heads * in.size(1, 2), b = in.size(0, 2);
  const std::int64_t dk = in.size(1, 20), dv = in.flag() ? dk : in.size(1, 20);
  const Problem pr{b, n, kv_heads, s, dk, dv};
  TestTensor<T> q({b, s, n, dk}), k({b, s, kv_heads, dk}), v({b, s, kv_heads, dv}),
      out({b, s, n, dv}, in.size(0, 2));
  std::mt19937 rng(in.seed());
  const bool specials = in.rarely(8);
  fill(q, rng, specials);
  fill(k, rng);
  fill(v, rng);
  AttentionOptions options;
  if (in.rarely(8)) options.scale = in.edge_float(0.2f);
  const float scale = options.scale.value_or(1.f / std::sqrt(float(dk)));
  const bool compared = !specials && scale <= 4.f;
  const auto out_before = out.snapshot();

  switch (in.size(0, 4)) {
    case 0: {  // rainfusion_attention, patterns given (or classified)
      std::vector<HeadPattern> patterns;
      if (in.flag()) {
        for (std::int64_t i = 0; i < b * n; ++i) {
          patterns.push_back(in.rarely(32) ? static_cast<HeadPattern>(in.size(4, 200))
                                           : static_cast<HeadPattern>(in.size(0, 3)));
        }
        if (in.rarely(16) && !patterns.empty()) patterns.pop_back();
      }
      const bool ok = accepted([&] {
        rainfusion_attention(q.view(), k.view(), v.view(), patterns, out.view(), rf, options);
      });
      const std::string context = "rainfusion_attention";
      if (!ok) return expect_unchanged(out, out_before, context);
      expect_canaries(out, context);
      if (!compared || patterns.empty() || s == 0) return;
      // Each head against the reference with its pattern's mask.
      std::vector<TestTensor<std::uint8_t>> masks;
      for (int pattern = 0; pattern < 4; ++pattern) {
        masks.emplace_back(std::vector<std::int64_t>{s, s});
        rainfusion_mask(static_cast<HeadPattern>(pattern), rf, test::as_bool(masks.back().view()));
      }
      const std::vector<double> ref =
          reference(pr, q, k, v, scale, [&](auto bi, auto h, auto i, auto j) {
            return masks[static_cast<int>(patterns[bi * n + h])].at(i * s + j) != 0;
          });
      return check_close(out, ref, test::flash_tolerance<T>(), context);
    }
    case 1: {  // rainfusion_classify
      std::vector<HeadPattern> patterns;
      if (!accepted([&] { patterns = rainfusion_classify(q.view(), k.view(), rf, options); }))
        return;
      if (static_cast<std::int64_t>(patterns.size()) != b * n) {
        failure("rainfusion_classify: " + std::to_string(patterns.size()) + " patterns for " +
                std::to_string(b * n) + " heads");
      }
      for (HeadPattern p : patterns) {
        if (p != HeadPattern::spatial && p != HeadPattern::temporal && p != HeadPattern::textural) {
          failure("rainfusion_classify: pattern " + std::to_string(static_cast<int>(p)));
        }
      }
      return;
    }
    case 2: {  // rainfusion_adaptive_blocks, then block_sparse_attention with its mask
      const int block_size = in.rarely(16) ? static_cast<int>(in.size(0, 200)) : in.pick({64, 128});
      const std::int64_t blocks = (s + std::max(block_size, 1) - 1) / std::max(block_size, 1);
      TestTensor<std::uint8_t> block_mask({b, n, blocks, blocks});
      const auto mask_before = block_mask.snapshot();
      if (!accepted([&] {
            rainfusion_adaptive_blocks(q.view(), k.view(), rf, block_size,
                                       test::as_bool(block_mask.view()), options);
          })) {
        return expect_unchanged(block_mask, mask_before, "rainfusion_adaptive_blocks");
      }
      expect_canaries(block_mask, "rainfusion_adaptive_blocks");
      if (!accepted([&] {
            block_sparse_attention(q.view(), k.view(), v.view(), test::as_bool(block_mask.view()),
                                   block_size, out.view(), options);
          })) {
        failure("block_sparse_attention refused rainfusion_adaptive_blocks' mask");
      }
      expect_canaries(out, "block_sparse_attention");
      return;
    }
    case 3: {  // rainfusion_mask and rainfusion_density
      const HeadPattern pattern = in.rarely(16) ? static_cast<HeadPattern>(in.size(4, 100))
                                                : static_cast<HeadPattern>(in.size(0, 3));
      const std::int64_t side = small && !in.rarely(16) ? tokens_of(rf) : in.size(0, 8);
      TestTensor<std::uint8_t> mask({side, side});
      const auto before = mask.snapshot();
      if (!accepted([&] { rainfusion_mask(pattern, rf, test::as_bool(mask.view())); })) {
        expect_unchanged(mask, before, "rainfusion_mask");
      }
      expect_canaries(mask, "rainfusion_mask");
      double density = 0;
      if (small && accepted([&] { density = rainfusion_density(pattern, rf); }) &&
          !(density >= 0 && density <= 1)) {
        failure("rainfusion_density: " + std::to_string(density));
      }
      return;
    }
    default: {  // block_sparse_attention with any block mask, attn_mask and causal on top
      const int block_size = in.rarely(16) ? static_cast<int>(in.size(0, 200)) : in.pick({64, 128});
      const std::int64_t blocks = (s + std::max(block_size, 1) - 1) / std::max(block_size, 1);
      const bool rank4 = in.flag();
      std::vector<std::int64_t> shape = {in.flag() ? n : 1, blocks, blocks};
      if (rank4) shape.insert(shape.begin(), in.flag() ? b : 1);
      TestTensor<std::uint8_t> block_mask(shape), token_mask({s, s});
      for (std::int64_t i = 0; i < block_mask.size(); ++i) block_mask.at(i) = chance(rng, 0.6f);
      for (std::int64_t i = 0; i < token_mask.size(); ++i) token_mask.at(i) = chance(rng, 0.6f);
      options.causal = in.flag();
      const bool masked = in.flag();
      if (masked) options.attn_mask = test::as_bool(token_mask.view());
      const bool ok = accepted([&] {
        block_sparse_attention(q.view(), k.view(), v.view(), test::as_bool(block_mask.view()),
                               block_size, out.view(), options);
      });
      const std::string context = "block_sparse_attention";
      if (!ok) return expect_unchanged(out, out_before, context);
      expect_canaries(out, context);
      if (!compared) return;
      const std::int64_t heads_extent = shape[shape.size() - 3];
      const std::int64_t batch_extent = rank4 ? shape[0] : 1;
      const std::vector<double> ref =
          reference(pr, q, k, v, scale, [&](auto bi, auto h, auto i, auto j) {
            const std::int64_t mb = batch_extent == 1 ? 0 : bi, mh = heads_extent == 1 ? 0 : h;
            const bool block =
                block_mask.at(((mb * heads_extent + mh) * blocks + i / block_size) * blocks +
                              j / block_size) != 0;
            const bool token = !masked || token_mask.at(i * s + j) != 0;
            return block && token && (!options.causal || j <= i);
          });
      return check_close(out, ref, test::flash_tolerance<T>(), context);
    }
  }
}

}  // namespace
}  // namespace ditops::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ditops;
  fuzz::Input in(data, size);
  fuzz::set_threads(in);
  if (in.flag()) {
    fuzz::sparse<float>(in);
  } else {
    fuzz::sparse<bf16>(in);
  }
  return 0;
}
