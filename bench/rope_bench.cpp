// RoPE on out-of-cache tensors, both modes and both layouts: ditops beside an Eigen-expression
// baseline (BSND) with the same threads. Shapes: FLUX [1, 4608, 24, 128] and an LLM-like
// [1, 8192, 24, 128] (8192 x 3072 elements), BSND or BNSD (head_first), cos/sin [S, 128] in f32
// or, for 16-bit x, in x's dtype (as ONNX Runtime takes them; ditops widens such a table row to
// fp32 once for the heads that share it).

#include <omp.h>

#include <Eigen/Core>
#include <cmath>
#include <ditops/rope.hpp>
#include <ditops/runtime.hpp>

#include "bench/support.hpp"

namespace ditops::bench {
namespace {

constexpr std::int64_t kHeads = 24, kDim = 128;
const std::int64_t kSeqs[] = {4608, 8192};

/// The baseline a user would write: Eigen array expressions per row, rows split over threads.
template <class T>
void eigen_rope(const T* x, const float* cos, const float* sin, T* out, std::int64_t seq,
                bool interleaved, int threads) {
  using S = EigenScalar<T>;
  using Row = Eigen::Array<S, 1, Eigen::Dynamic>;
  constexpr std::int64_t kHalf = kDim / 2;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t row = 0; row < seq * kHeads; ++row) {
    const std::int64_t s = row / kHeads;
    const Eigen::Map<const Row> xr(reinterpret_cast<const S*>(x) + row * kDim, kDim);
    Eigen::Map<Row> yr(reinterpret_cast<S*>(out) + row * kDim, kDim);
    const Eigen::Map<const Eigen::ArrayXf> c(cos + s * kDim, kDim), sn(sin + s * kDim, kDim);
    const Eigen::ArrayXf xf = xr.template cast<float>().transpose();
    Eigen::ArrayXf rotated(kDim);
    if (interleaved) {
      const Eigen::Map<const Eigen::ArrayXf, 0, Eigen::InnerStride<2>> even(xf.data(), kHalf);
      const Eigen::Map<const Eigen::ArrayXf, 0, Eigen::InnerStride<2>> odd(xf.data() + 1, kHalf);
      Eigen::Map<Eigen::ArrayXf, 0, Eigen::InnerStride<2>>(rotated.data(), kHalf) = -odd;
      Eigen::Map<Eigen::ArrayXf, 0, Eigen::InnerStride<2>>(rotated.data() + 1, kHalf) = even;
    } else {
      rotated << -xf.tail(kHalf), xf.head(kHalf);
    }
    yr = (xf * c + rotated * sn).transpose().template cast<S>();
  }
}

template <class T>
void BM_rope(benchmark::State& state) {
  const std::int64_t seq = kSeqs[state.range(0)];
  const bool interleaved = state.range(1) != 0;
  const int threads = static_cast<int>(state.range(2));
  const bool eigen = state.range(3) != 0;
  const bool head_first = state.range(4) != 0;
  const std::int64_t skip = skip_elements<T>(state, 5);
  const bool table_in_x_dtype = state.range(6) != 0;
  const std::int64_t elements = seq * kHeads * kDim;
  const std::int64_t bytes = 2 * elements * static_cast<std::int64_t>(sizeof(T));
  ColdBuffers<T> x(elements + skip, bytes), out(elements + skip, bytes, 2);
  std::vector<float> cos(seq * kDim), sin(seq * kDim);
  std::vector<T> cos_x(seq * kDim), sin_x(seq * kDim);  // the same, in x's dtype
  for (std::int64_t i = 0; i < seq * kDim; ++i) {
    const double angle = (i / kDim) * std::pow(10000.0, -2.0 * (i % (kDim / 2)) / kDim);
    cos[i] = static_cast<float>(std::cos(angle));
    sin[i] = static_cast<float>(std::sin(angle));
    cos_x[i] = from_float<T>(cos[i]);
    sin_x[i] = from_float<T>(sin[i]);
  }
  const TensorView cos_view =
      table_in_x_dtype ? view(cos_x.data(), {seq, kDim}) : view(cos.data(), {seq, kDim});
  const TensorView sin_view =
      table_in_x_dtype ? view(sin_x.data(), {seq, kDim}) : view(sin.data(), {seq, kDim});
  set_num_threads(threads);
  const RotatedMode mode =
      interleaved ? RotatedMode::rotated_interleaved : RotatedMode::rotated_half;
  int iteration = 0;
  for (auto _ : state) {
    T* xs = x.copy(iteration) + skip;
    T* ys = out.copy(iteration++) + skip;
    if (eigen) {
      eigen_rope(xs, cos.data(), sin.data(), ys, seq, interleaved, threads);
    } else {
      const auto shape =
          head_first ? view(xs, {1, kHeads, seq, kDim}) : view(xs, {1, seq, kHeads, kDim});
      TensorView out_view = shape;
      out_view.data = ys;
      rotary_position_embedding(shape, cos_view, sin_view, out_view, mode, head_first);
    }
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(eigen ? "eigen " : "ditops ") + dtype_name(detail::dtype_of<T>()) +
                 (interleaved ? " interleaved" : " half") +
                 (head_first ? " BNSD [1, 24, " + std::to_string(seq) + ", 128]"
                             : " BSND [1, " + std::to_string(seq) + ", 24, 128]") +
                 (skip ? " misaligned" : "") + (table_in_x_dtype ? " tables in x's dtype" : ""));
  // x read and out written; the [S, D] tables are reused across 24 heads and are not counted.
  report_bandwidth(state, static_cast<double>(bytes), threads);
}

// Args: sequence index, interleaved, threads, baseline (0 = ditops, 1 = Eigen), layout
// (0 = BSND, 1 = BNSD; the Eigen baseline is BSND only), misaligned (x and out 16 bytes past a
// cache line, as allocators put them; ditops BSND at FLUX's length), tables in x's dtype (16-bit
// x, ditops BSND at FLUX's length, aligned and misaligned: the widened-table path).
template <bool kSixteenBit>
void rope_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"seq", "interleaved", "threads", "eigen", "head_first", "misaligned", "x_tables"});
  for (int seq = 0; seq < 2; ++seq) {
    for (int interleaved : {0, 1}) {
      for (int threads : {1, 2}) {
        for (int eigen : {0, 1}) b->Args({seq, interleaved, threads, eigen, 0, 0, 0});
        b->Args({seq, interleaved, threads, 0, 1, 0, 0});
        if (seq == 0) b->Args({seq, interleaved, threads, 0, 0, 1, 0});
        if (seq == 0 && kSixteenBit) {
          for (int misaligned : {0, 1}) b->Args({seq, interleaved, threads, 0, 0, misaligned, 1});
        }
      }
    }
  }
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK_TEMPLATE(BM_rope, float)->Apply(rope_args<false>);
BENCHMARK_TEMPLATE(BM_rope, bf16)->Apply(rope_args<true>);
BENCHMARK_TEMPLATE(BM_rope, f16)->Apply(rope_args<true>);

}  // namespace
}  // namespace ditops::bench
