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

struct MlaInputs {
  std::int64_t batch, kv, heads;
  std::vector<std::int8_t> nope;
  std::vector<float> scale;
  std::vector<bf16> rope;
  std::vector<std::int32_t> table, lens;
  std::vector<float> q_nope, q_rope, out;

  MlaInputs(std::int64_t b, std::int64_t kv_len, std::int64_t h) : batch(b), kv(kv_len), heads(h) {
    const std::int64_t blocks_per_seq = (kv + kBlockSize - 1) / kBlockSize;
    const std::int64_t blocks = batch * blocks_per_seq;
    std::mt19937 rng(7);
    nope.resize(blocks * kBlockSize * 512);
    std::uniform_int_distribution<int> byte(-127, 127);
    for (auto& v : nope) v = static_cast<std::int8_t>(byte(rng));
    scale.assign(blocks * kBlockSize * kGroups, 0.02f);
    std::normal_distribution<float> normal;
    rope.resize(blocks * kBlockSize * 64);
    for (auto& v : rope) v = bf16::from_float(normal(rng));
    std::vector<std::int32_t> ids(blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);  // paged: a sequence's blocks are scattered
    table = ids;
    lens.assign(batch, static_cast<std::int32_t>(kv));
    q_nope.resize(batch * heads * 512);
    q_rope.resize(batch * heads * 64);
    for (auto& v : q_nope) v = normal(rng);
    for (auto& v : q_rope) v = normal(rng);
    out.resize(batch * heads * 512);
  }
  MlaPagedCache cache() {
    const std::int64_t blocks = static_cast<std::int64_t>(table.size());
    return {view(nope.data(), {blocks, kBlockSize, 512}),
            view(scale.data(), {blocks, kBlockSize, kGroups}),
            view(rope.data(), {blocks, kBlockSize, 64})};
  }
};

/// Args: batch, kv, heads, chunk, threads, splits (0 = automatic).
void BM_mla_decode(benchmark::State& state) {
  const std::int64_t batch = state.range(0), kv = state.range(1), heads = state.range(2);
  const int chunk = static_cast<int>(state.range(3)), threads = static_cast<int>(state.range(4));
  MlaInputs in(batch, kv, heads);
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
  set_num_threads(0);
}

void quick_args(benchmark::internal::Benchmark* b) {
  for (std::int64_t heads : {16, 128}) {
    for (std::int64_t batch : {1, 4, 16}) {
      for (std::int64_t threads : {1, 2}) b->Args({batch, 2048, heads, 2, threads, 0});
    }
    b->Args({1, 2048, heads, 2, 2, 1});  // B = 1: one split vs automatic split-KV (above)
    b->Args({1, 4096, heads, 2, 2, 1});
    b->Args({1, 4096, heads, 2, 2, 0});
  }
}

void grid_args(benchmark::internal::Benchmark* b) {
  for (std::int64_t heads : {16, 128}) {
    for (std::int64_t kv : {512, 2048, 4096}) {
      for (std::int64_t batch : {1, 2, 4, 8, 16, 24, 48}) {
        for (std::int64_t chunk : {1, 2, 4}) {
          for (std::int64_t threads : {1, 2}) b->Args({batch, kv, heads, chunk, threads, 0});
        }
      }
    }
  }
}

BENCHMARK(BM_mla_decode)
    ->Name("mla_decode")
    ->ArgNames({"b", "kv", "h", "chunk", "threads", "splits"})
    ->Apply(quick_args)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();
BENCHMARK(BM_mla_decode)
    ->Name("mla_grid")
    ->ArgNames({"b", "kv", "h", "chunk", "threads", "splits"})
    ->Apply(grid_args)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime()
    ->MinTime(0.05);

}  // namespace
}  // namespace ditops::bench
