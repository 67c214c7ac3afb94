// MLA decode on buffers as users allocate them: q_nope, q_rope, the paged cache (int8 values,
// scales, rope values), the block table and out starting at every offset within a cache line
// (16 bytes past one is where malloc and numpy put large arrays; each tensor at the offset
// rounded down to its element size) give the bits of the line-aligned run and write nothing
// outside out; f32 and bf16, G = 4 scale groups, two sequences with partial blocks, 2 threads.

#include "tests/support/line_offsets.hpp"

#include <ditops/mla.hpp>
#include <ditops/runtime.hpp>
#include <string>
#include <vector>

#include "tests/support/scoped_threads.hpp"

namespace ditops::test {
namespace {

constexpr std::int64_t kBatch = 2, kHeads = 4, kBlockSize = 64, kGroups = 4, kBlocks = 3;
constexpr std::int64_t kNope = kMlaNopeDim, kRope = kMlaRopeDim;

template <class Q, class R>
void expect_decode_offsets_equal() {
  const ScopedThreads threads(2);
  // Sequence 0 takes blocks 2 and 0 (100 tokens), sequence 1 block 1 (37 tokens).
  const std::vector<std::int32_t> lens = {100, 37}, table0 = {2, 0, 1, 1};
  std::vector<std::int32_t> slots;
  for (std::int32_t t = 0; t < lens[0]; ++t) slots.push_back(table0[t / 64] * 64 + t % 64);
  for (std::int32_t t = 0; t < lens[1]; ++t) slots.push_back(table0[2] * 64 + t);
  const auto tokens = static_cast<std::int64_t>(slots.size());
  const std::vector<float> latent = normal_values<float>(slots.size() * (kNope + kRope), 3);
  std::vector<std::int8_t> nope0(static_cast<std::size_t>(kBlocks * kBlockSize * kNope));
  std::vector<float> scale0(static_cast<std::size_t>(kBlocks * kBlockSize * kGroups));
  std::vector<R> rope0(static_cast<std::size_t>(kBlocks * kBlockSize * kRope));
  mla_fill_cache(view(latent.data(), {tokens, kNope + kRope}), view(slots.data(), {tokens}),
                 {view(nope0.data(), {kBlocks, kBlockSize, kNope}),
                  view(scale0.data(), {kBlocks, kBlockSize, kGroups}),
                  view(rope0.data(), {kBlocks, kBlockSize, kRope})});
  const std::vector<Q> q_nope0 = normal_values<Q>(kBatch * kHeads * kNope, 4);
  const std::vector<Q> q_rope0 = normal_values<Q>(kBatch * kHeads * kRope, 5);
  OffsetBuffer<std::int8_t> nope(nope0.size());
  OffsetBuffer<float> scale(scale0.size());
  OffsetBuffer<R> rope(rope0.size());
  OffsetBuffer<std::int32_t> table(table0.size());
  OffsetBuffer<Q> q_nope(q_nope0.size()), q_rope(q_rope0.size()), out(q_nope0.size());
  const auto run = [&](std::size_t offset) {
    const MlaPagedCache cache = {
        view(nope.place_copy(offset, nope0), {kBlocks, kBlockSize, kNope}),
        view(scale.place_copy(offset, scale0), {kBlocks, kBlockSize, kGroups}),
        view(rope.place_copy(offset, rope0), {kBlocks, kBlockSize, kRope})};
    Q* result = out.place(offset);
    mla_decode_paged(view(q_nope.place_copy(offset, q_nope0), {kBatch, kHeads, kNope}),
                     view(q_rope.place_copy(offset, q_rope0), {kBatch, kHeads, kRope}), cache,
                     view(table.place_copy(offset, table0), {kBatch, 2}), lens,
                     view(result, {kBatch, kHeads, kNope}));
    EXPECT_TRUE(out.guards_intact()) << "offset " << offset;
    return bytes_of(result, q_nope0.size());
  };
  expect_every_offset_equals_aligned(1, run,
                                     std::string("mla_decode_paged q and out ") +
                                         dtype_name(detail::dtype_of<Q>()) + ", rope " +
                                         dtype_name(detail::dtype_of<R>()));
}

TEST(MlaLineOffsets, DecodeEveryOffsetEqualsTheAlignedRun) {
  expect_decode_offsets_equal<float, float>();
  expect_decode_offsets_equal<bf16, bf16>();
  expect_decode_offsets_equal<float, bf16>();
}

}  // namespace
}  // namespace ditops::test
