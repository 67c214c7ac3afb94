// MLA paged decode (one query token per sequence) over an int8 latent cache in FlashMLA's
// layout: 512 int8 + 4 fp32 group scales + 64 bf16 rope = 656 bytes per token, block size 128
// (the Ascend kernel's), shuffled block tables.
//
// Two families, both filterable with --benchmark_filter:
//   mla_decode/...  a quick subset for the demo (B 1/4/16, kv 2048, 16 and 128 heads, chunk 2,
//                   threads 1 and 2, and B = 1 with one split vs automatic split-KV);
//   mla_grid/...    the full issue grid: batch {1,2,4,8,16,24,48} x kv {512,2048,4096} x heads
//                   {16,128} x chunk {1,2,4} x threads {1,2} (several minutes).
// Counters: GB/s of cache read and its fraction of the measured bandwidth (frac_bw: the limit
// for 16 heads), GOP/s of the dot products (2 * B * kv * H * (576 + 512)) and their fraction of
// the measured int8 peak (frac_int8: the limit for 128 heads, where MLA decode is compute-bound;
// Q·K^T and P·V both run as int8 dot products, vpdpbusd with AVX512-VNNI; no frac_int8 where
// the CPU, as capped, has no int8 peak). Small cases (B * kv * 656 B below the last-level cache)
// read the cache from cache, so their GB/s can exceed memory bandwidth.

#include <algorithm>
#include <ditops/mla.hpp>
#include <ditops/runtime.hpp>
#include <numeric>
#include <string>

#include "bench/support.hpp"

namespace ditops::bench {
namespace {

constexpr std::int64_t kBlockSize = 128;
constexpr std::int64_t kGroups = 4;
constexpr double kBytesPerToken = 512 + 4 * kGroups + 64 * 2;

/// The cache and the query of one decode step; every tensor on a cache line, or 16 bytes past
/// one (misaligned).
struct MlaInputs {
  std::int64_t batch, kv, heads, blocks;
  PlacedBuffer<std::int8_t> nope;
  PlacedBuffer<float> scale;
  PlacedBuffer<bf16> rope;
  std::vector<std::int32_t> table, lens;
  PlacedBuffer<float> q_nope, q_rope, out;

  MlaInputs(std::int64_t b, std::int64_t kv_len, std::int64_t h, bool misaligned)
      : batch(b),
        kv(kv_len),
        heads(h),
        blocks(batch * ((kv + kBlockSize - 1) / kBlockSize)),
        nope(blocks * kBlockSize * 512, misaligned),
        scale(blocks * kBlockSize * kGroups, misaligned),
        rope(normal_buffer<bf16>(blocks * kBlockSize * 64, misaligned, 8)),
        q_nope(normal_buffer<float>(batch * heads * 512, misaligned, 9)),
        q_rope(normal_buffer<float>(batch * heads * 64, misaligned, 10)),
        out(batch * heads * 512, misaligned) {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> byte(-127, 127);
    for (std::size_t i = 0; i < nope.size(); ++i) nope[i] = static_cast<std::int8_t>(byte(rng));
    for (std::size_t i = 0; i < scale.size(); ++i) scale[i] = 0.02f;
    std::vector<std::int32_t> ids(blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);  // paged: a sequence's blocks are scattered
    table = ids;
    lens.assign(batch, static_cast<std::int32_t>(kv));
  }
  MlaPagedCache cache() {
    return {view(nope.data(), {blocks, kBlockSize, 512}),
            view(scale.data(), {blocks, kBlockSize, kGroups}),
            view(rope.data(), {blocks, kBlockSize, 64})};
  }
};

/// Args: batch, kv, heads, chunk, threads, splits (0 = automatic), misaligned (every tensor 16
/// bytes past a cache line).
void BM_mla_decode(benchmark::State& state) {
  const std::int64_t batch = state.range(0), kv = state.range(1), heads = state.range(2);
  const int chunk = static_cast<int>(state.range(3)), threads = static_cast<int>(state.range(4));
  const bool misaligned = state.range(6) != 0;
  MlaInputs in(batch, kv, heads, misaligned);
  MlaDecodeOptions options;
  options.chunk = chunk;
  options.num_splits = static_cast<int>(state.range(5));
  set_num_threads(threads);
  const TensorView q_nope = view(in.q_nope.data(), {batch, heads, 512});
  const TensorView q_rope = view(in.q_rope.data(), {batch, heads, 64});
  const TensorView table =
      view(in.table.data(), {batch, static_cast<std::int64_t>(in.table.size()) / batch});
  const TensorView out = view(in.out.data(), {batch, heads, 512});
  const MlaPagedCache cache = in.cache();
  for (auto _ : state) {
    mla_decode_paged(q_nope, q_rope, cache, table, in.lens, out, options);
    benchmark::DoNotOptimize(in.out.data());
    benchmark::ClobberMemory();
  }
  const double tokens = static_cast<double>(batch * kv);
  report_bandwidth(state, tokens * kBytesPerToken, threads);
  report_int8_ops(state, 2.0 * tokens * static_cast<double>(heads) * (576 + 512), threads);
  state.SetLabel(placement_label(misaligned));
  set_num_threads(0);
}

void quick_args(benchmark::internal::Benchmark* b) {
  for (std::int64_t heads : {16, 128}) {
    for (std::int64_t batch : {1, 4, 16}) {
      for (std::int64_t threads : {1, 2}) {
        b->Args({batch, 2048, heads, 2, threads, 0, 0});
        if (batch == 16) b->Args({batch, 2048, heads, 2, threads, 0, 1});
      }
    }
    b->Args({1, 2048, heads, 2, 2, 1, 0});  // B = 1: one split vs automatic split-KV (above)
    b->Args({1, 4096, heads, 2, 2, 1, 0});
    b->Args({1, 4096, heads, 2, 2, 0, 0});
  }
}

void grid_args(benchmark::internal::Benchmark* b) {
  for (std::int64_t heads : {16, 128}) {
    for (std::int64_t kv : {512, 2048, 4096}) {
      for (std::int64_t batch : {1, 2, 4, 8, 16, 24, 48}) {
        for (std::int64_t chunk : {1, 2, 4}) {
          for (std::int64_t threads : {1, 2}) b->Args({batch, kv, heads, chunk, threads, 0, 0});
        }
      }
    }
  }
}

BENCHMARK(BM_mla_decode)
    ->Name("mla_decode")
    ->ArgNames({"b", "kv", "h", "chunk", "threads", "splits", "misaligned"})
    ->Apply(quick_args)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_mla_decode)
    ->Name("mla_grid")
    ->ArgNames({"b", "kv", "h", "chunk", "threads", "splits", "misaligned"})
    ->Apply(grid_args)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime()
    ->MinTime(0.05);

}  // namespace
}  // namespace ditops::bench
