// Block-sparse attention on buffers as users allocate them: q, k, v, out and lse starting at
// every offset within a cache line (16 bytes past one is where malloc and numpy put large
// arrays) give the bits of the line-aligned run and write nothing outside out and lse; f32 and
// bf16, BSND, GQA, a partial last block, 2 threads.

#include "tests/support/line_offsets.hpp"

#include <ditops/attention.hpp>
#include <ditops/runtime.hpp>
#include <ditops/sparse.hpp>
#include <random>
#include <string>
#include <vector>

#include "tests/support/placed_attention.hpp"
#include "tests/support/scoped_threads.hpp"

namespace ditops::test {
namespace {

template <class T>
void expect_block_sparse_offsets_equal() {
  constexpr std::int64_t kSeq = 150, kHeads = 4, kKvHeads = 2, kDim = 64;
  constexpr int kBlock = 64;
  constexpr std::int64_t kBlocks = (kSeq + kBlock - 1) / kBlock;
  const ScopedThreads threads(2);
  PlacedAttention<T> t(kSeq, kSeq, kHeads, kKvHeads, kDim);
  std::vector<std::uint8_t> mask(static_cast<std::size_t>(kHeads * kBlocks * kBlocks));
  std::mt19937 rng(5);
  std::bernoulli_distribution keep(0.6);
  for (std::uint8_t& kept : mask) kept = keep(rng);
  const auto shape = [](T* data, std::int64_t heads) { return view(data, {1, kSeq, heads, kDim}); };
  const auto run = [&](std::size_t offset) {
    t.place(offset);
    AttentionOptions options;
    options.lse = view(t.lse_data, {1, kHeads, kSeq});
    block_sparse_attention(shape(t.q_data, kHeads), shape(t.k_data, kKvHeads),
                           shape(t.v_data, kKvHeads),
                           as_bool(view(mask.data(), {kHeads, kBlocks, kBlocks})), kBlock,
                           shape(t.out_data, kHeads), options);
    EXPECT_TRUE(t.guards_intact()) << "offset " << offset;
    return t.outputs();
  };
  expect_every_offset_equals_aligned(
      sizeof(T), run, std::string("block_sparse_attention ") + dtype_name(detail::dtype_of<T>()));
}

TEST(BlockSparseLineOffsets, EveryOffsetEqualsTheAlignedRun) {
  expect_block_sparse_offsets_equal<float>();
  expect_block_sparse_offsets_equal<bf16>();
}

}  // namespace
}  // namespace ditops::test
