// The q/k RMSNorm + RoPE of DiT attention on out-of-cache tensors: the fused
// rms_norm_rotary_position_embedding beside rms_norm followed by rotary_position_embedding (in
// place on rms_norm's output: the cheapest unfused pair) on the same buffers, same threads.
// Shapes: FLUX's q [1, 4096, 24, 128] normalized per head (weight [128]) and Wan's
// [1, 4680, 12, 128] normalized per token (weight [1536]); interleaved pairs (both models'
// rotary layout), cos/sin [S, 128] in f32.

#include <cmath>
#include <ditops/norm.hpp>
#include <ditops/rope.hpp>
#include <ditops/runtime.hpp>
#include <string>
#include <vector>

#include "bench/support.hpp"

namespace ditops::bench {
namespace {

constexpr std::int64_t kDim = 128;

struct Shape {
  const char* model;
  std::int64_t seq, heads;
  bool per_token;  ///< weight [N * D] (a token's heads together), else [D]
};
const Shape kShapes[] = {{"flux", 4096, 24, false}, {"wan", 4680, 12, true}};

template <class T>
void BM_norm_rope(benchmark::State& state) {
  const Shape& shape = kShapes[state.range(0)];
  const int threads = static_cast<int>(state.range(1));
  const bool fused = state.range(2) != 0;
  const std::int64_t skip = skip_elements<T>(state, 3);
  const std::int64_t seq = shape.seq, heads = shape.heads;
  const std::int64_t elements = seq * heads * kDim;
  // The traffic of the operation (x read once, out written once), for both variants: their
  // GB/s compare as their speeds do. The unfused pair moves twice that.
  const std::int64_t bytes = 2 * elements * static_cast<std::int64_t>(sizeof(T));
  ColdBuffers<T> x(elements + skip, bytes), out(elements + skip, bytes, 2);
  std::vector<float> cos(seq * kDim), sin(seq * kDim);
  for (std::int64_t i = 0; i < seq * kDim; ++i) {
    const double angle = (i / kDim) * std::pow(10000.0, -2.0 * (i % kDim / 2) / kDim);
    cos[i] = static_cast<float>(std::cos(angle));
    sin[i] = static_cast<float>(std::sin(angle));
  }
  const std::int64_t group = shape.per_token ? heads * kDim : kDim;
  std::vector<float> weight(static_cast<std::size_t>(group), 1.f);
  const TensorView weight_view = view(weight.data(), {group});
  const TensorView cos_view = view(cos.data(), {seq, kDim}),
                   sin_view = view(sin.data(), {seq, kDim});
  set_num_threads(threads);
  const RotatedMode mode = RotatedMode::rotated_interleaved;
  int iteration = 0;
  for (auto _ : state) {
    T* xs = x.copy(iteration) + skip;
    T* ys = out.copy(iteration++) + skip;
    const TensorView x_view = view(xs, {1, seq, heads, kDim});
    const TensorView out_view = view(ys, {1, seq, heads, kDim});
    if (fused) {
      rms_norm_rotary_position_embedding(x_view, weight_view, 1e-6f, cos_view, sin_view, out_view,
                                         mode);
    } else {
      if (shape.per_token) {
        rms_norm(view(xs, {1, seq, heads * kDim}), weight_view, 1e-6f,
                 view(ys, {1, seq, heads * kDim}));
      } else {
        rms_norm(x_view, weight_view, 1e-6f, out_view);
      }
      rotary_position_embedding(out_view, cos_view, sin_view, out_view, mode);
    }
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(fused ? "fused " : "rms_norm+rope ") + shape.model + " " +
                 dtype_name(detail::dtype_of<T>()) + " [1, " + std::to_string(seq) + ", " +
                 std::to_string(heads) + ", 128]" +
                 (shape.per_token ? " per-token norm" : " per-head norm") +
                 (skip ? " misaligned" : ""));
  report_bandwidth(state, static_cast<double>(bytes), threads);
}

// Args: shape (0 = FLUX per-head, 1 = Wan per-token), threads, fused (1) or rms_norm then
// rotary_position_embedding (0), misaligned (x and out 16 bytes past a cache line, as
// allocators put them).
void norm_rope_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"shape", "threads", "fused", "misaligned"});
  for (int shape : {0, 1}) {
    for (int threads : {1, 2}) {
      for (int misaligned : {0, 1}) {
        for (int fused : {1, 0}) b->Args({shape, threads, fused, misaligned});
      }
    }
  }
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK_TEMPLATE(BM_norm_rope, float)->Apply(norm_rope_args);
BENCHMARK_TEMPLATE(BM_norm_rope, bf16)->Apply(norm_rope_args);

}  // namespace
}  // namespace ditops::bench
