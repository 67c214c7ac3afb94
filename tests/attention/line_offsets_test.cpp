// Attention on buffers as users allocate them: q, k, v, out (and lse) starting at every offset
// within a cache line (16 bytes past one is where malloc and numpy put large arrays) give the
// bits of the line-aligned run, with nothing written outside out and lse: dense (BSND and BNSD,
// causal or not, GQA) and varlen calls, on the flash, flash_bf16 and int8 backends, every dtype,
// 2 threads. The shapes have partial tiles and rows that are not whole cache lines.

#include "tests/support/line_offsets.hpp"

#include <ditops/attention.hpp>
#include <ditops/runtime.hpp>
#include <random>
#include <string>
#include <vector>

#include "tests/support/placed_attention.hpp"
#include "tests/support/scoped_threads.hpp"

namespace ditops::test {
namespace {

constexpr std::int64_t kHeads = 4, kKvHeads = 2, kDim = 72;

std::string describe(const char* call, DType dtype, AttentionBackend backend, bool causal) {
  return std::string(call) + " " + dtype_name(dtype) + " " + backend_name(backend) +
         (causal ? " causal" : "");
}

template <class T>
void expect_dense_offsets_equal(AttentionBackend backend, bool causal, bool head_first) {
  constexpr std::int64_t kSq = 77, kSk = 93;
  PlacedAttention<T> t(kSq, kSk, kHeads, kKvHeads, kDim);
  const auto shape = [&](T* data, std::int64_t seq, std::int64_t heads) {
    return head_first ? view(data, {1, heads, seq, kDim}) : view(data, {1, seq, heads, kDim});
  };
  AttentionOptions options;
  options.backend = backend;
  options.causal = causal;
  options.head_first = head_first;
  const auto run = [&](std::size_t offset) {
    t.place(offset);
    options.lse = view(t.lse_data, {1, kHeads, kSq});
    attention_forward(shape(t.q_data, kSq, kHeads), shape(t.k_data, kSk, kKvHeads),
                      shape(t.v_data, kSk, kKvHeads), shape(t.out_data, kSq, kHeads), options);
    EXPECT_TRUE(t.guards_intact()) << "offset " << offset;
    return t.outputs();
  };
  expect_every_offset_equals_aligned(
      sizeof(T), run,
      describe("attention_forward", detail::dtype_of<T>(), backend, causal) +
          (head_first ? " BNSD" : " BSND"));
}

template <class T>
void expect_varlen_offsets_equal(AttentionBackend backend, bool causal) {
  const std::vector<std::int32_t> cu_q = {0, 5, 70, 71, 110}, cu_k = {0, 9, 60, 131, 150};
  PlacedAttention<T> t(cu_q.back(), cu_k.back(), kHeads, kKvHeads, kDim);
  VarlenOptions options;
  options.backend = backend;
  options.causal = causal;
  const auto run = [&](std::size_t offset) {
    t.place(offset);
    options.lse = view(t.lse_data, {kHeads, std::int64_t{cu_q.back()}});
    attention_forward_varlen(view(t.q_data, {cu_q.back(), kHeads, kDim}),
                             view(t.k_data, {cu_k.back(), kKvHeads, kDim}),
                             view(t.v_data, {cu_k.back(), kKvHeads, kDim}), cu_q, cu_k,
                             view(t.out_data, {cu_q.back(), kHeads, kDim}), options);
    EXPECT_TRUE(t.guards_intact()) << "offset " << offset;
    return t.outputs();
  };
  expect_every_offset_equals_aligned(
      sizeof(T), run, describe("attention_forward_varlen", detail::dtype_of<T>(), backend, causal));
}

const AttentionBackend kBackends[] = {AttentionBackend::flash, AttentionBackend::flash_bf16,
                                      AttentionBackend::int8};

TEST(AttentionLineOffsets, DenseEveryOffsetEqualsTheAlignedRun) {
  const ScopedThreads threads(2);
  for (const AttentionBackend backend : kBackends) {
    for (const bool causal : {false, true}) {
      expect_dense_offsets_equal<float>(backend, causal, false);
      expect_dense_offsets_equal<bf16>(backend, causal, false);
      expect_dense_offsets_equal<f16>(backend, causal, true);
    }
  }
}

TEST(AttentionLineOffsets, VarlenEveryOffsetEqualsTheAlignedRun) {
  const ScopedThreads threads(2);
  for (const AttentionBackend backend : kBackends) {
    for (const bool causal : {false, true}) {
      expect_varlen_offsets_equal<float>(backend, causal);
      expect_varlen_offsets_equal<bf16>(backend, causal);
    }
  }
}

}  // namespace
}  // namespace ditops::test
