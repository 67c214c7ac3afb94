// mla_decode_paged against the fp64 reference on the dequantized cache (mixed and ragged
// seq_lens, shuffled block tables, G = 1 and 4, rope f32/bf16, chunk 1/2/4, splits, 1 and 2
// threads); mla_fill_cache against the documented quantization; every class of bad input.

#include <algorithm>
#include <cmath>
#include <ditops/mla.hpp>
#include <ditops/runtime.hpp>
#include <limits>
#include <numeric>

#include "ops/core/isa.hpp"
#include "ops/mla/mla_kernel.hpp"
#include "tests/reference/mla_ref.hpp"
#include "tests/support/expect_rejected.hpp"
#include "tests/support/tolerance.hpp"

namespace ditops::test {
namespace {

// With q quantized as the library does, what remains is the quantization of the P·V weights
// (bounded per element by the reference's p_bound) and fp32 rounding: logits to ~1e-6, the
// exp2 polynomial (2e-7 relative), and the fp32 sums of P·V over <= ~1000 tokens, a random walk
// of about sqrt(n) * 2^-24 * max|v| (~1e-6 measured; |v| <= ~4 here). 3e-5 absolute is a few
// times that walk's spread; an error of one in a single int32 dot product (3 units of the
// offset correction) already moves outputs by 3e-4.
inline constexpr Tolerance kTightF32{1e-5, 3e-5};
// bf16 output: one round-to-nearest-even of the result (2^-9 relative) on top.
inline constexpr Tolerance kTightBf16{1.0 / 256, 3e-5};

constexpr int kNope = 512, kRope = 64, kLatent = kNope + kRope;

struct MlaConfig {
  int heads;
  int block_size;
  int groups;
  std::vector<std::int32_t> seq_lens;
  /// Cache bytes overwritten with -128 and 127 (a cache written by other code than
  /// mla_fill_cache, which keeps to [-127, 127]): the SSE4.2/AVX2 Q·K multiplies |k| (128 as u8)
  /// by q carrying k's sign, exact for any byte; the sign trick the other way round (|q| times
  /// k carrying q's sign) would leave -128 negative, which this catches.
  bool extreme_bytes = false;
};

std::string describe(const MlaConfig& c, const char* types) {
  std::string s = std::string(types) + " h" + std::to_string(c.heads) + " bs" +
                  std::to_string(c.block_size) + " G" + std::to_string(c.groups) + " lens [";
  for (std::size_t i = 0; i < c.seq_lens.size(); ++i) {
    s += (i ? "," : "") + std::to_string(c.seq_lens[i]);
  }
  return s + "] isa " + active_isa_name();
}

/// A filled paged cache for the config: blocks shuffled across sequences, two spare blocks,
/// block-table entries past each sequence's end set to ids that are out of range (only used
/// entries may be read).
template <class R>
struct PagedSetup {
  std::int64_t num_blocks = 0, max_blocks = 0;
  TestTensor<std::int8_t> nope;
  TestTensor<float> scale;
  TestTensor<R> rope;
  TestTensor<std::int32_t> table;
  std::vector<std::int32_t> lens;

  PagedSetup(const MlaConfig& c, std::mt19937& rng)
      : num_blocks(blocks_of(c) + 2),
        max_blocks(max_blocks_of(c)),
        nope({num_blocks, c.block_size, kNope}),
        scale({num_blocks, c.block_size, c.groups}),
        rope({num_blocks, c.block_size, kRope}),
        table({static_cast<std::int64_t>(c.seq_lens.size()), max_blocks}),
        lens(c.seq_lens) {
    std::vector<std::int32_t> ids(num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::size_t next = 0;
    std::vector<std::int32_t> slots;
    for (std::size_t b = 0; b < lens.size(); ++b) {
      const std::int64_t used = (lens[b] + c.block_size - 1) / c.block_size;
      for (std::int64_t i = 0; i < max_blocks; ++i) {
        table.at(b * max_blocks + i) =
            i < used ? ids[next++] : static_cast<std::int32_t>(num_blocks + 1000 + i);
      }
      for (std::int32_t t = 0; t < lens[b]; ++t) {
        slots.push_back(table.at(b * max_blocks + t / c.block_size) * c.block_size +
                        t % c.block_size);
      }
    }
    // Latents like a real model's: per-channel offsets and spreads, so group scales differ.
    const auto tokens = static_cast<std::int64_t>(slots.size());
    TestTensor<float> latent({std::max<std::int64_t>(tokens, 1), kLatent});
    std::normal_distribution<float> normal;
    std::vector<float> channel_scale(kLatent), channel_offset(kLatent);
    for (int d = 0; d < kLatent; ++d) {
      channel_scale[d] = 0.3f + 1.5f * std::fabs(normal(rng));
      channel_offset[d] = 0.3f * normal(rng);
    }
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (int d = 0; d < kLatent; ++d) {
        latent.at(t * kLatent + d) = channel_offset[d] + channel_scale[d] * normal(rng);
      }
    }
    if (tokens > 0) {
      TensorView latent_view = latent.view();
      latent_view.shape[0] = tokens;
      mla_fill_cache(latent_view, view(slots.data(), {tokens}), cache());
    }
  }
  MlaPagedCache cache() { return {nope.view(), scale.view(), rope.view()}; }

  static std::int64_t blocks_of(const MlaConfig& c) {
    std::int64_t total = 0;
    for (auto len : c.seq_lens) total += (len + c.block_size - 1) / c.block_size;
    return total;
  }
  static std::int64_t max_blocks_of(const MlaConfig& c) {
    std::int64_t most = 1;
    for (auto len : c.seq_lens)
      most = std::max<std::int64_t>(most, (len + c.block_size - 1) / c.block_size);
    return most + 1;  // one spare column of out-of-range ids
  }
};

/// weight_levels: the u8 levels of the P·V weights of the kernels that run.
template <class Q, class R, class O>
void check_config(const MlaConfig& c, std::mt19937& rng,
                  const std::vector<int>& split_counts = {0, 1, 3, 8},
                  int weight_levels = mla_weight_levels()) {
  const std::string types = std::string("q ") + dtype_name(detail::dtype_of<Q>()) + " rope " +
                            dtype_name(detail::dtype_of<R>()) + " out " +
                            dtype_name(detail::dtype_of<O>());
  const std::string context = describe(c, types.c_str());
  const auto batch = static_cast<std::int64_t>(c.seq_lens.size());
  PagedSetup<R> setup(c, rng);
  if (c.extreme_bytes) {
    for (std::int64_t i = 0; i < setup.nope.size(); i += 5) {
      setup.nope.at(i) = static_cast<std::int8_t>(i % 2 ? -128 : 127);
    }
  }
  TestTensor<Q> q_nope({batch, c.heads, kNope}), q_rope({batch, c.heads, kRope});
  q_nope.fill_normal(rng, 0.1f, 1.f);
  q_rope.fill_normal(rng, 0.f, 1.f);
  const double scale = 1.0 / std::sqrt(576.0);
  const MlaReference tight = mla_reference(q_nope, q_rope, setup.nope, setup.scale, setup.rope,
                                           setup.table, setup.lens, scale, true, weight_levels);
  const MlaReference exact_q = mla_reference(q_nope, q_rope, setup.nope, setup.scale, setup.rope,
                                             setup.table, setup.lens, scale, false, weight_levels);
  const Tolerance tol = std::is_same_v<O, bf16> ? kTightBf16 : kTightF32;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (int splits : split_counts) {
      std::vector<O> first_chunk_result;
      for (int chunk : {1, 2, 4}) {
        const std::string run = context + " threads " + std::to_string(threads) + " splits " +
                                std::to_string(splits) + " chunk " + std::to_string(chunk);
        TestTensor<O> out({batch, c.heads, kNope});
        MlaDecodeOptions options;
        options.chunk = chunk;
        options.num_splits = splits;
        mla_decode_paged(q_nope.view(), q_rope.view(), setup.cache(), setup.table.view(),
                         setup.lens, out.view(), options);
        // Against q quantized as the library does: within the P·V weight quantization bound
        // plus fp32 rounding; against fp32 q: within both quantization bounds.
        std::int64_t outside_tight = 0, outside = 0;
        for (std::int64_t i = 0; i < out.size(); ++i) {
          const double tight_bound =
              tight.p_bound[i] + tol.atol + tol.rtol * std::fabs(tight.out[i]);
          if (!(std::fabs(out.value(i) - tight.out[i]) <= tight_bound)) ++outside_tight;
          const double bound = exact_q.bound[i / kNope] + exact_q.p_bound[i] + tol.atol +
                               tol.rtol * std::fabs(exact_q.out[i]);
          if (!(std::fabs(out.value(i) - exact_q.out[i]) <= bound)) ++outside;
        }
        EXPECT_EQ(outside_tight, 0) << run << ": outside the weight-quantization bound";
        EXPECT_EQ(outside, 0) << run << ": outside the q- and weight-quantization bounds";
        // chunk only reorders whole-block stages: the per-block arithmetic is identical.
        std::vector<O> result(static_cast<std::size_t>(out.size()));
        for (std::int64_t i = 0; i < out.size(); ++i) result[i] = out.at(i);
        if (first_chunk_result.empty()) {
          first_chunk_result = result;
        } else {
          EXPECT_EQ(
              0, std::memcmp(result.data(), first_chunk_result.data(), result.size() * sizeof(O)))
              << run << ": differs from chunk 1";
        }
      }
    }
  }
  set_num_threads(0);
}

TEST(MlaDecode, OneLongSequence) {
  std::mt19937 rng(11);
  check_config<float, float, float>({16, 64, 1, {1000}}, rng);
}

TEST(MlaDecode, ExtremeCacheBytes) {
  std::mt19937 rng(48);
  check_config<float, float, float>({16, 64, 4, {300, 77}, true}, rng, {0, 2});
}

TEST(MlaDecode, RaggedBatchBf16) {
  std::mt19937 rng(12);
  check_config<bf16, bf16, bf16>({128, 128, 4, {1, 300, 129}}, rng);
}

TEST(MlaDecode, SixteenSequencesWithTails) {
  std::mt19937 rng(13);
  std::vector<std::int32_t> lens = {1,  64, 65, 127, 128, 129, 3,  200,
                                    63, 17, 90, 150, 2,   190, 31, 100};
  check_config<float, bf16, float>({16, 64, 4, lens}, rng, {0, 2});
}

TEST(MlaDecode, ZeroLengthGivesZerosAndOddHeads) {
  std::mt19937 rng(14);
  check_config<float, float, float>({20, 128, 1, {0, 257, 128}}, rng, {0, 1, 8});
}

TEST(MlaDecode, ManyHeadsOneSequence) {
  std::mt19937 rng(15);
  check_config<float, float, bf16>({128, 128, 1, {700}}, rng, {0, 1, 5});
}

/// mla_decode_paged runs `kernels` while this lives.
class MlaKernelsOverride {
 public:
  explicit MlaKernelsOverride(const mla::MlaKernels* kernels)
      : previous_(mla::override_mla_kernels(kernels)) {}
  ~MlaKernelsOverride() { mla::override_mla_kernels(previous_); }
  MlaKernelsOverride(const MlaKernelsOverride&) = delete;
  MlaKernelsOverride& operator=(const MlaKernelsOverride&) = delete;

 private:
  const mla::MlaKernels* previous_;
};

// The avx2+vnni kernels on the software model of vpdpbusd (ditops::avx2_vnni_model: AVX2
// instructions only), on any AVX2 CPU: u8 keys (k + 128) times s8 queries less the offset sums,
// 255 weight levels, 6-token and 6-head tiles; within the same bounds as every variant, with
// cache bytes of -128 and 127, odd heads, G = 1 and 4, bf16.
TEST(MlaDecode, AvxVnniModel) {
  if (core::supported_isa() < core::Isa::avx2) GTEST_SKIP() << "the model runs AVX2 instructions";
  static constexpr mla::MlaKernels kModel = mla::mla_kernels_of<avx2_vnni_model>();
  const MlaKernelsOverride model(&kModel);
  std::mt19937 rng(49);
  check_config<float, float, float>({16, 64, 4, {300, 77}, true}, rng, {0, 2}, 255);
  check_config<bf16, bf16, bf16>({128, 128, 4, {1, 300, 129}}, rng, {0, 3}, 255);
  check_config<float, bf16, float>({20, 128, 1, {0, 257, 128}}, rng, {0, 1}, 255);
}

TEST(MlaDecode, ZeroLengthRowsAreZero) {
  // The check above compares zeros with a zero reference; here a NaN-filled output must be
  // overwritten with exact zeros.
  std::mt19937 rng(16);
  MlaConfig c{16, 64, 1, {0, 5}};
  PagedSetup<float> setup(c, rng);
  TestTensor<float> q_nope({2, 16, kNope}), q_rope({2, 16, kRope}), out({2, 16, kNope});
  q_nope.fill_normal(rng);
  q_rope.fill_normal(rng);
  for (std::int64_t i = 0; i < out.size(); ++i) out.at(i) = std::nanf("");
  mla_decode_paged(q_nope.view(), q_rope.view(), setup.cache(), setup.table.view(), setup.lens,
                   out.view());
  for (std::int64_t i = 0; i < 16 * kNope; ++i) ASSERT_EQ(out.at(i), 0.f) << i;
  for (std::int64_t i = 16 * kNope; i < out.size(); ++i) ASSERT_TRUE(std::isfinite(out.at(i)));
}

/// One sequence of `tokens` cached latents (normal, with group 0 zeroed in every `zero_every`-th
/// token, as mla_fill_cache stores all-zero latents: scale 0) in two blocks of 64, and three
/// normal query heads.
struct ZeroGroupCache {
  TestTensor<std::int8_t> nope{{2, 64, kNope}};
  TestTensor<float> scale, rope{{2, 64, kRope}};
  TestTensor<std::int32_t> table{{1, 2}};
  std::vector<std::int32_t> lens;
  TestTensor<float> q_nope{{1, 3, kNope}}, q_rope{{1, 3, kRope}};

  ZeroGroupCache(std::int64_t groups, std::int64_t tokens, std::int64_t zero_every, unsigned seed)
      : scale({2, 64, groups}), lens{static_cast<std::int32_t>(tokens)} {
    TestTensor<float> latent({tokens, kLatent});
    std::mt19937 rng(seed);
    latent.fill_normal(rng);
    for (std::int64_t t = 0; t < tokens; t += zero_every) {
      for (std::int64_t d = 0; d < kNope / groups; ++d) latent.at(t * kLatent + d) = 0.f;
    }
    std::vector<std::int32_t> slots(tokens);
    std::iota(slots.begin(), slots.end(), 0);
    mla_fill_cache(latent.view(), view(slots.data(), {tokens}), cache());
    table.at(0) = 0;
    table.at(1) = 1;
    q_nope.fill_normal(rng);
    q_rope.fill_normal(rng);
  }
  MlaPagedCache cache() { return {nope.view(), scale.view(), rope.view()}; }
};

// Sequences whose latents are all zero in a scale group (as mla_fill_cache stores all-zero
// latents: scale 0) have zero values there, so the output's group is exactly 0 (it was 0 / 0,
// NaN), while a group with values is still the softmax average; G = 1 and 4, every split count.
TEST(MlaDecode, ZeroScaleGroupsGiveZerosNotNan) {
  for (const std::int64_t groups : {1, 4}) {
    const std::int64_t group_dim = kNope / groups;
    ZeroGroupCache c(groups, 70, 1, 17);  // group 0 zero everywhere (the whole row for G=1)
    for (const int splits : {0, 1, 2}) {
      TestTensor<float> out({1, 3, kNope});
      MlaDecodeOptions options;
      options.num_splits = splits;
      mla_decode_paged(c.q_nope.view(), c.q_rope.view(), c.cache(), c.table.view(), c.lens,
                       out.view(), options);
      for (std::int64_t h = 0; h < 3; ++h) {
        for (std::int64_t d = 0; d < kNope; ++d) {
          const float got = out.at(h * kNope + d);
          if (d < group_dim) {
            ASSERT_EQ(got, 0.f) << "G " << groups << " splits " << splits << " head " << h;
          } else {
            ASSERT_TRUE(std::isfinite(got)) << "G " << groups << " splits " << splits;
          }
        }
      }
    }
  }
}

// Tokens whose group is all zero (scale 0) among tokens with values: their softmax weight still
// counts (the output was divided by the other tokens' weights only: up to 10x too large, found
// by mla_fuzz). Against the reference within its quantization bounds, G = 1 and 4.
TEST(MlaDecode, ZeroScaleTokensKeepTheirSoftmaxWeight) {
  for (const std::int64_t groups : {1, 4}) {
    ZeroGroupCache c(groups, 100, 2, 18);  // group 0 zero in every other token
    TestTensor<float> out({1, 3, kNope});
    mla_decode_paged(c.q_nope.view(), c.q_rope.view(), c.cache(), c.table.view(), c.lens,
                     out.view());
    const MlaReference ref =
        mla_reference(c.q_nope, c.q_rope, c.nope, c.scale, c.rope, c.table, c.lens,
                      1.0 / std::sqrt(576.0), false, mla_weight_levels());
    std::int64_t outside = 0;
    for (std::int64_t i = 0; i < out.size(); ++i) {
      const double bound = ref.bound[i / kNope] + ref.p_bound[i] + kTightF32.atol +
                           kTightF32.rtol * std::fabs(ref.out[i]);
      outside += !(std::fabs(out.value(i) - ref.out[i]) <= bound);
    }
    EXPECT_EQ(outside, 0) << "G " << groups << " isa " << active_isa_name();
  }
}

template <class R>
void check_fill(int groups, std::mt19937& rng) {
  const std::int64_t blocks = 3, block_size = 64, tokens = 5;
  TestTensor<std::int8_t> nope({blocks, block_size, kNope});
  TestTensor<float> scale({blocks, block_size, groups});
  TestTensor<R> rope({blocks, block_size, kRope});
  TestTensor<float> latent({tokens, kLatent});
  latent.fill_normal(rng, 0.2f, 2.f);
  for (int d = 0; d < kNope / groups; ++d) latent.at(2 * kLatent + d) = 0.f;  // an all-zero group
  std::vector<std::int32_t> slots = {130, 0, 63, 64, 191};
  mla_fill_cache(latent.view(), view(slots.data(), {tokens}),
                 {nope.view(), scale.view(), rope.view()});
  const std::int64_t group_dim = kNope / groups;
  std::vector<bool> written(blocks * block_size, false);
  for (std::int64_t i = 0; i < tokens; ++i) {
    const std::int64_t slot = slots[i];
    written[slot] = true;
    for (int g = 0; g < groups; ++g) {
      std::vector<float> values(static_cast<std::size_t>(group_dim));
      for (std::int64_t d = 0; d < group_dim; ++d)
        values[d] = latent.at(i * kLatent + g * group_dim + d);
      const std::vector<double> expected = quantize_like_library(values);
      float max_abs = 0.f;
      for (float v : values) max_abs = std::max(max_abs, std::fabs(v));
      ASSERT_EQ(scale.at(slot * groups + g), max_abs / 127.f) << "token " << i << " group " << g;
      for (std::int64_t d = 0; d < group_dim; ++d) {
        const double got =
            nope.value(slot * kNope + g * group_dim + d) * scale.value(slot * groups + g);
        ASSERT_EQ(got, expected[d]) << "token " << i << " dim " << g * group_dim + d;
        // Rounding to nearest: the dequantized value is within half a step of the input.
        ASSERT_LE(std::fabs(got - values[d]), max_abs / 127.0 / 2 * (1 + 1e-6));
      }
    }
    for (int d = 0; d < kRope; ++d) {
      ASSERT_TRUE(
          same_bits(rope.at(slot * kRope + d), from_float<R>(latent.at(i * kLatent + kNope + d))));
    }
  }
  for (std::int64_t slot = 0; slot < blocks * block_size; ++slot) {
    if (written[slot]) continue;
    for (int d = 0; d < kNope; ++d) ASSERT_EQ(nope.at(slot * kNope + d), 0) << "slot " << slot;
  }
  EXPECT_EQ(nope.damaged_canaries(), 0);
  EXPECT_EQ(scale.damaged_canaries(), 0);
  EXPECT_EQ(rope.damaged_canaries(), 0);
}

TEST(MlaFillCache, QuantizesAsDocumented) {
  std::mt19937 rng(21);
  check_fill<float>(1, rng);
  check_fill<bf16>(4, rng);
}

// ---- bad inputs -----------------------------------------------------------------------------

struct BadInputs {
  std::mt19937 rng{31};
  MlaConfig config{16, 64, 4, {70, 5}};
  PagedSetup<float> setup{config, rng};
  TestTensor<float> q_nope{{2, 16, kNope}}, q_rope{{2, 16, kRope}}, out{{2, 16, kNope}};
  TensorView table = setup.table.view();
  std::vector<std::int32_t> lens = setup.lens;
  MlaPagedCache cache = setup.cache();
  MlaDecodeOptions options;

  void call() {
    mla_decode_paged(q_nope.view(), q_rope.view(), cache, table, lens, out.view(), options);
  }
};

TEST(MlaDecode, RejectsBadInputs) {
  auto expect = [](auto&& mutate, const std::string& needle) {
    BadInputs bad;
    mutate(bad);
    expect_rejected([&] { bad.call(); }, needle, bad.out);
  };
  expect(
      [](BadInputs& b) {
        b.table = view(static_cast<std::int32_t*>(b.table.data), {2, 1});
      },
      "seq_lens[0] (70) exceeds its block_table row");
  expect([](BadInputs& b) { b.setup.table.at(1) = 9; },
         "block_table[0][1] (9) is out of range [0, 5)");
  expect([](BadInputs& b) { b.setup.table.at(0) = -1; }, "block_table[0][0] (-1) is out of range");
  expect([](BadInputs& b) { b.lens[1] = -3; }, "seq_lens[1] (-3) is negative");
  expect([](BadInputs& b) { b.lens.pop_back(); }, "seq_lens has 1 entries");
  expect([](BadInputs& b) { b.options.chunk = 3; }, "options.chunk (3) must be 1, 2 or 4");
  expect([](BadInputs& b) { b.options.num_splits = -1; }, "options.num_splits (-1)");
  expect([](BadInputs& b) { b.options.scale = std::nanf(""); }, "options.scale");
  expect([](BadInputs& b) { b.options.scale = 0.f; }, "options.scale");
  expect([](BadInputs& b) { b.cache.nope.shape[2] = 511; },
         "cache.nope.shape[2] (511) must be 512");
  expect([](BadInputs& b) { b.cache.nope.dtype = DType::u8; }, "cache.nope.dtype");
  expect([](BadInputs& b) { b.cache.nope_scale.shape[2] = 2; }, "cache.nope_scale.shape[2] (G 2)");
  expect([](BadInputs& b) { b.cache.rope.dtype = DType::f16; }, "cache.rope.dtype");
  expect([](BadInputs& b) { b.cache.rope.shape[0] = 3; }, "cache.rope.shape[0] (3) must equal");
  expect(
      [](BadInputs& b) {
        b.cache.nope.shape[1] = 32;
        b.cache.nope_scale.shape[1] = 32;
        b.cache.rope.shape[1] = 32;
      },
      "block_size 32");
  expect([](BadInputs& b) { b.table.dtype = DType::f32; }, "block_table.dtype");
  BadInputs aliasing;
  TensorView q_as_out = aliasing.q_nope.view();
  expect_rejected(
      [&] {
        mla_decode_paged(aliasing.q_nope.view(), aliasing.q_rope.view(), aliasing.cache,
                         aliasing.table, aliasing.lens, q_as_out, {});
      },
      "out may overlap q_nope", aliasing.q_nope);
  BadInputs wrong_dims;
  TestTensor<float> small_rope({2, 16, 32});
  expect_rejected(
      [&] {
        mla_decode_paged(wrong_dims.q_nope.view(), small_rope.view(), wrong_dims.cache,
                         wrong_dims.table, wrong_dims.lens, wrong_dims.out.view(), {});
      },
      "q_rope.shape[2] (32) must be 64", wrong_dims.out);
  BadInputs wrong_heads;
  TestTensor<float> out_heads({2, 8, kNope});
  expect_rejected(
      [&] {
        mla_decode_paged(wrong_heads.q_nope.view(), wrong_heads.q_rope.view(), wrong_heads.cache,
                         wrong_heads.table, wrong_heads.lens, out_heads.view(), {});
      },
      "out.shape[1] (8) must equal q_nope.shape[1] (16)", out_heads);
}

TEST(MlaFillCache, RejectsBadInputs) {
  std::mt19937 rng(32);
  TestTensor<std::int8_t> nope({2, 64, kNope});
  TestTensor<float> scale({2, 64, 1});
  TestTensor<float> rope({2, 64, kRope});
  TestTensor<float> latent({3, kLatent});
  latent.fill_normal(rng);
  const MlaPagedCache cache{nope.view(), scale.view(), rope.view()};
  auto expect = [&](std::vector<std::int32_t> slots, const std::string& needle) {
    expect_rejected([&] { mla_fill_cache(latent.view(), view(slots.data(), {3}), cache); }, needle,
                    nope);
    EXPECT_TRUE(scale.damaged_canaries() == 0);
  };
  expect({0, 128, 1}, "slots[1] (128) is out of range [0, 128)");
  expect({0, -1, 1}, "slots[1] (-1) is out of range");
  expect({5, 6, 5}, "repeats");
  latent.at(kLatent + 7) = std::numeric_limits<float>::infinity();
  expect({0, 1, 2}, "latent[1][7] (inf) is not finite");
  latent.at(kLatent + 7) = 0.f;
  TestTensor<float> narrow({3, 512});
  std::vector<std::int32_t> slots = {0, 1, 2};
  expect_rejected([&] { mla_fill_cache(narrow.view(), view(slots.data(), {3}), cache); },
                  "latent.shape[1] (512) must be 576", nope);
}

// Non-finite data is the caller's choice: NaN and infinity in sequence 0's queries, cached rope
// values and scales propagate within sequence 0 and never crash, write outside out or reach
// sequence 1, for every chunk and split count. mla_fill_cache alone refuses them (an int8 scale
// of infinity would make the whole group NaN), before writing anything.
TEST(MlaNonFinite, NanAndInfStayInTheirSequence) {
  set_num_threads(2);
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(95);
  const MlaConfig c{16, 64, 4, {300, 200}};
  PagedSetup<float> setup(c, rng);
  TestTensor<float> q_nope({2, 16, kNope}), q_rope({2, 16, kRope}), out({2, 16, kNope});
  q_nope.fill_normal(rng);
  q_rope.fill_normal(rng);
  q_nope.at(3) = kNan;
  q_nope.at(kNope + 5) = kInf;
  q_rope.at(2 * kRope + 7) = -kInf;
  const std::int64_t block0 = setup.table.at(0), block1 = setup.table.at(1);
  setup.rope.at(block0 * 64 * kRope + 3) = kNan;
  setup.scale.at(block0 * 64 * 4 + 4 * 2 + 1) = kInf;
  TestTensor<float> latent({2, kLatent});
  latent.fill_normal(rng);
  latent.at(1) = kNan;
  latent.at(kLatent + 2) = kInf;
  latent.at(kLatent + kNope + 1) = -kInf;
  const std::vector<std::int32_t> slots = {static_cast<std::int32_t>(block1 * 64 + 5),
                                           static_cast<std::int32_t>(block1 * 64 + 6)};
  const auto cache_before = setup.nope.snapshot();
  for (const std::int64_t bad : {1, kLatent + 2, kLatent + kNope + 1}) {
    TestTensor<float> one_bad({2, kLatent});
    one_bad.fill_normal(rng);
    one_bad.at(bad) = latent.value(bad);
    expect_rejected([&] { mla_fill_cache(one_bad.view(), view(slots.data(), {2}), setup.cache()); },
                    "is not finite", setup.nope);
  }
  EXPECT_TRUE(setup.nope.unchanged_since(cache_before));
  for (const int chunk : {1, 2, 4}) {
    for (const int splits : {0, 1, 3}) {
      MlaDecodeOptions options;
      options.chunk = chunk;
      options.num_splits = splits;
      mla_decode_paged(q_nope.view(), q_rope.view(), setup.cache(), setup.table.view(), setup.lens,
                       out.view(), options);
      EXPECT_EQ(out.damaged_canaries(), 0) << chunk << " " << splits;
      for (std::int64_t e = out.size() / 2; e < out.size(); ++e) {
        ASSERT_TRUE(std::isfinite(out.value(e))) << "chunk " << chunk << " splits " << splits;
      }
    }
  }
}

}  // namespace
}  // namespace ditops::test
