// mla_fill_cache and mla_decode_paged over their argument space: block sizes, scale groups,
// rope and query dtypes, slots (duplicates, out of range, negative), block tables (ids out of
// range in used and unused entries), sequence lengths (0, past the table), chunks, split counts,
// scales up to and past the limit, non-finite latents and queries, broken views. Accepted
// decodes are checked against the fp64 reference within its quantization bounds
// (tests/reference/mla_ref.hpp).

#include <algorithm>
#include <ditops/mla.hpp>

#include "fuzz/support.hpp"
#include "tests/reference/mla_ref.hpp"

namespace ditops::fuzz {
namespace {

constexpr std::int64_t kNope = kMlaNopeDim, kRope = kMlaRopeDim, kLatent = kNope + kRope;
// tests/mla/mla_test.cpp's tolerances on top of the reference's quantization bounds.
constexpr Tolerance kMlaF32{1e-5, 3e-5};
constexpr Tolerance kMlaBf16{1.0 / 256, 3e-5};

template <class Q, class R, class O>
void decode(Input& in) {
  const std::int64_t block_size = in.pick<std::int64_t>({64, 128});
  const std::int64_t groups = in.pick<std::int64_t>({1, 4});
  const std::int64_t num_blocks = in.size(0, 3), batch = in.size(0, 2), heads = in.size(1, 3);
  std::mt19937 rng(in.seed());
  TestTensor<std::int8_t> nope({num_blocks, block_size, kNope});
  TestTensor<float> nope_scale({num_blocks, block_size, groups});
  TestTensor<R> rope({num_blocks, block_size, kRope});
  const MlaPagedCache cache{nope.view(), nope_scale.view(), rope.view()};

  // Fill some slots from latents (any slot number; duplicates and out-of-range ones are Errors).
  const std::int64_t tokens = in.size(0, 40);
  TestTensor<Q> latent({tokens, kLatent});
  TestTensor<std::int32_t> slots({tokens});
  const bool latent_specials = in.rarely(8);
  fill(latent, rng, latent_specials);
  for (std::int64_t t = 0; t < tokens; ++t) {
    slots.at(t) =
        in.rarely(16)
            ? static_cast<std::int32_t>(in.size(-2, num_blocks * block_size + 2))
            : static_cast<std::int32_t>(t % std::max<std::int64_t>(num_blocks * block_size, 1));
  }
  const auto nope_before = nope.snapshot();
  const auto scale_before = nope_scale.snapshot();
  if (!accepted([&] { mla_fill_cache(latent.view(), slots.view(), cache); })) {
    expect_unchanged(nope, nope_before, "mla_fill_cache cache.nope");
    expect_unchanged(nope_scale, scale_before, "mla_fill_cache cache.nope_scale");
  } else {
    if (latent_specials && tokens > 0) failure("mla_fill_cache accepted non-finite latents");
    std::vector<std::int32_t> seen;
    for (std::int64_t t = 0; t < tokens; ++t) seen.push_back(slots.at(t));
    std::sort(seen.begin(), seen.end());
    if (std::adjacent_find(seen.begin(), seen.end()) != seen.end() ||
        (!seen.empty() && (seen.front() < 0 || seen.back() >= num_blocks * block_size))) {
      failure("mla_fill_cache accepted a slot twice or outside the cache");
    }
  }
  expect_canaries(nope, "mla_fill_cache cache.nope");
  expect_canaries(nope_scale, "mla_fill_cache cache.nope_scale");
  expect_canaries(rope, "mla_fill_cache cache.rope");
  // Unfilled slots hold zeros; a scale of zero makes their values zero too. Now and then a
  // non-finite cached value (the caller's choice: it propagates within its sequence).
  const bool cache_specials = in.rarely(16);
  if (cache_specials && nope_scale.size() > 0) {
    nope_scale.at(in.size(0, nope_scale.size() - 1)) = std::numeric_limits<float>::infinity();
  }

  // Decode: block tables over the blocks, lengths up to the table (or past it).
  const std::int64_t max_blocks = in.size(0, 2);
  TestTensor<std::int32_t> table({batch, max_blocks});
  std::vector<std::int32_t> seq_lens;
  bool lengths_ok = true;
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i < max_blocks; ++i) {
      table.at(b * max_blocks + i) =
          in.rarely(16)
              ? static_cast<std::int32_t>(in.size(-3, num_blocks + 3))
              : static_cast<std::int32_t>(in.size(0, std::max<std::int64_t>(num_blocks - 1, 0)));
    }
    const std::int64_t len = in.rarely(16) ? in.size(-2, (max_blocks + 1) * block_size)
                                           : in.size(0, max_blocks * block_size);
    lengths_ok &= len >= 0 && len <= max_blocks * block_size;
    seq_lens.push_back(static_cast<std::int32_t>(len));
  }
  TestTensor<Q> q_nope({batch, heads, kNope}, in.size(0, 2)), q_rope({batch, heads, kRope});
  TestTensor<O> out({batch, heads, kNope}, in.size(0, 2));
  const bool q_specials = in.rarely(8);
  fill(q_nope, rng, q_specials);
  fill(q_rope, rng);
  MlaDecodeOptions options;
  if (in.rarely(4)) options.scale = in.edge_float(0.04f);
  options.chunk = in.rarely(32) ? static_cast<int>(in.size(-1, 8)) : in.pick({1, 2, 4});
  options.num_splits =
      in.rarely(16) ? static_cast<int>(in.size(-2, 1000)) : static_cast<int>(in.size(0, 4));
  TensorView out_view = out.view();
  const bool broken = in.rarely(16);
  if (broken) out_view = q_nope.view();  // overlapping (or mismatched) output
  const auto out_before = out.snapshot();
  const std::string context = std::string("mla_decode_paged q ") + dtype_name(q_nope.view().dtype) +
                              " rope " + dtype_name(rope.view().dtype) + " out " +
                              dtype_name(out.view().dtype);
  const bool ok = accepted([&] {
    mla_decode_paged(q_nope.view(), q_rope.view(), cache, table.view(), seq_lens, out_view,
                     options);
  });
  if (!ok) return expect_unchanged(out, out_before, context);
  expect_canaries(out, context + " out");
  if (broken && batch > 0) failure(context + ": accepted out overlapping q_nope");
  if (!lengths_ok) failure(context + ": accepted a sequence length outside its block table");
  const float scale = options.scale.value_or(1.f / std::sqrt(576.f));
  if (!(std::isfinite(scale) && scale > 0.f && scale <= 65536.f)) {
    failure(context + ": accepted scale " + std::to_string(scale));
  }
  for (std::int64_t b = 0; b < batch; ++b) {  // every used table entry names a block
    for (std::int64_t i = 0; i < (seq_lens[b] + block_size - 1) / block_size; ++i) {
      const std::int32_t id = table.at(b * max_blocks + i);
      if (id < 0 || id >= num_blocks)
        failure(context + ": accepted block id " + std::to_string(id));
    }
  }
  if (q_specials || cache_specials || scale > 4.f) return;
  const test::MlaReference ref =
      test::mla_reference(q_nope, q_rope, nope, nope_scale, rope, table, seq_lens, scale, false,
                          test::mla_weight_levels());
  const Tolerance tol = std::is_same_v<O, bf16> ? kMlaBf16 : kMlaF32;
  for (std::int64_t i = 0; i < out.size(); ++i) {
    const double want = ref.out[static_cast<std::size_t>(i)];
    const double bound = ref.bound[static_cast<std::size_t>(i / kNope)] +
                         ref.p_bound[static_cast<std::size_t>(i)] + tol.atol +
                         tol.rtol * std::fabs(want);
    if (!(std::fabs(out.value(i) - want) <= bound)) {
      failure(context + ": element " + std::to_string(i) + " is " + std::to_string(out.value(i)) +
              ", the reference " + std::to_string(want) + " (bound " + std::to_string(bound) + ")");
    }
  }
}

}  // namespace
}  // namespace ditops::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ditops;
  fuzz::Input in(data, size);
  fuzz::set_threads(in);
  switch (in.size(0, 3)) {
    case 0:
      fuzz::decode<float, float, float>(in);
      break;
    case 1:
      fuzz::decode<float, bf16, bf16>(in);
      break;
    case 2:
      fuzz::decode<bf16, float, float>(in);
      break;
    default:
      fuzz::decode<bf16, bf16, bf16>(in);
  }
  return 0;
}
