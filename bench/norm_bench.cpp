// RMSNorm and LayerNorm on out-of-cache tensors: ditops beside an Eigen-expression baseline run
// with the same threads (row blocks per OpenMP thread), in the same process. RMSNorm shapes:
// [8192, 3072] (an LLM / DiT hidden state), FLUX's per-head QK-norm [4608 * 24, 128] and a wider
// hidden state [4096, 5120]. With misaligned = 1 every tensor starts 16 bytes past a cache line,
// as the large allocations of std::vector (glibc's malloc) do, where framework tensors are
// aligned. LayerNorm with AdaLN's scale and shift: FLUX's image stream [1, 4608, 3072] and a
// Wan 2.1 1.3B 480p video latent [1, 32760, 1536].

#include <omp.h>

#include <Eigen/Core>
#include <cmath>
#include <ditops/norm.hpp>
#include <ditops/runtime.hpp>

#include "bench/support.hpp"

namespace ditops::bench {
namespace {

constexpr float kEps = 1e-6f;

struct Shape {
  std::int64_t rows, dim;
};
const Shape kShapes[] = {{8192, 3072}, {4608 * 24, 128}, {4096, 5120}};
constexpr int kShapeCount = 3;
/// The baseline a user would write: one Eigen expression per row block.
template <class T>
void eigen_rms_norm(const T* x, const float* weight, T* out, std::int64_t rows, std::int64_t dim,
                    int threads) {
  using S = EigenScalar<T>;
  using Matrix = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::Map<const Eigen::RowVectorXf> w(weight, dim);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    const std::int64_t begin = rows * t / n, end = rows * (t + 1) / n;
    const Eigen::Map<const Matrix> X(reinterpret_cast<const S*>(x) + begin * dim, end - begin, dim);
    Eigen::Map<Matrix> Y(reinterpret_cast<S*>(out) + begin * dim, end - begin, dim);
    const auto xf = X.template cast<float>().array();
    const Eigen::ArrayXf inv_rms = ((xf.square().rowwise().mean()) + kEps).rsqrt();
    Y = ((xf.colwise() * inv_rms).rowwise() * w.array()).matrix().template cast<S>();
  }
}

template <class T>
void BM_rms_norm(benchmark::State& state) {
  const Shape shape = kShapes[state.range(0)];
  const int threads = static_cast<int>(state.range(1));
  const bool eigen = state.range(2) != 0;
  const std::int64_t skip = skip_elements<T>(state, 3);
  const std::int64_t elements = shape.rows * shape.dim;
  const std::int64_t bytes =
      2 * elements * static_cast<std::int64_t>(sizeof(T));  // read x, write y
  ColdBuffers<T> x(elements + skip, bytes), out(elements + skip, bytes, 2);
  std::vector<float> weight(shape.dim, 1.1f);
  set_num_threads(threads);
  int iteration = 0;
  for (auto _ : state) {
    T* xs = x.copy(iteration) + skip;
    T* ys = out.copy(iteration++) + skip;
    if (eigen) {
      eigen_rms_norm(xs, weight.data(), ys, shape.rows, shape.dim, threads);
    } else {
      rms_norm(view(xs, {shape.rows, shape.dim}), view(weight.data(), {shape.dim}), kEps,
               view(ys, {shape.rows, shape.dim}));
    }
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(eigen ? "eigen " : "ditops ") + dtype_name(detail::dtype_of<T>()) +
                 " [" + std::to_string(shape.rows) + ", " + std::to_string(shape.dim) + "]" +
                 (skip ? " misaligned" : ""));
  report_bandwidth(state, static_cast<double>(bytes), threads);
}

template <class T>
void BM_add_rms_norm(benchmark::State& state) {
  const Shape shape = kShapes[state.range(0)];
  const int threads = static_cast<int>(state.range(1));
  const std::int64_t skip = skip_elements<T>(state, 2);
  const std::int64_t elements = shape.rows * shape.dim;
  const std::int64_t bytes =
      4 * elements * static_cast<std::int64_t>(sizeof(T));  // x, r in; h, y out
  ColdBuffers<T> x(elements + skip, bytes), residual(elements + skip, bytes, 2),
      out(elements + skip, bytes, 3), sum(elements + skip, bytes, 4);
  std::vector<float> weight(shape.dim, 1.1f);
  set_num_threads(threads);
  int iteration = 0;
  for (auto _ : state) {
    const auto v = [&](T* p) { return view(p + skip, {shape.rows, shape.dim}); };
    add_rms_norm(v(x.copy(iteration)), v(residual.copy(iteration)),
                 view(weight.data(), {shape.dim}), kEps, v(out.copy(iteration)),
                 v(sum.copy(iteration)));
    ++iteration;
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string("ditops ") + dtype_name(detail::dtype_of<T>()) + " [" +
                 std::to_string(shape.rows) + ", " + std::to_string(shape.dim) + "]" +
                 (skip ? " misaligned" : ""));
  report_bandwidth(state, static_cast<double>(bytes), threads);
}

struct LayerNormShape {
  std::int64_t batch, seq, dim;
};
const LayerNormShape kLayerNormShapes[] = {{1, 4608, 3072}, {1, 32760, 1536}};
constexpr int kLayerNormShapeCount = 2;
/// What multiplies and shifts the normalized rows: nothing (layer_norm), one scale and shift
/// row per batch element (AdaLN as DiTs use it), or a row of each per token.
enum class Modulation { none = 0, per_batch = 1, per_token = 2 };

/// The AdaLN baseline a user would write: Eigen expressions per row (contiguous rows, which
/// Eigen vectorizes; one expression over a block of rows took ten times as long), per-batch
/// scale and shift (B = 1: one row of each), row blocks per OpenMP thread.
template <class T>
void eigen_layer_norm_scale_shift(const T* x, const float* weight, const float* bias,
                                  const float* scale, const float* shift, T* out, std::int64_t rows,
                                  std::int64_t dim, int threads) {
  using S = EigenScalar<T>;
  using Row = Eigen::Array<float, 1, Eigen::Dynamic>;
  using StoredRow = Eigen::Array<S, 1, Eigen::Dynamic>;
  const Eigen::Map<const Row> w(weight, dim), b(bias, dim), s(scale, dim), h(shift, dim);
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    for (std::int64_t r = rows * t / n; r < rows * (t + 1) / n; ++r) {
      const Eigen::Map<const StoredRow> xr(reinterpret_cast<const S*>(x) + r * dim, dim);
      Eigen::Map<StoredRow> yr(reinterpret_cast<S*>(out) + r * dim, dim);
      const auto xf = xr.template cast<float>();
      const float mean = xf.mean();
      const float inv_std = 1.f / std::sqrt((xf - mean).square().mean() + kEps);
      yr = ((((xf - mean) * inv_std) * w + b) * (1.f + s) + h).template cast<S>();
    }
  }
}

template <class T>
void BM_layer_norm_scale_shift(benchmark::State& state) {
  const LayerNormShape shape = kLayerNormShapes[state.range(0)];
  const int threads = static_cast<int>(state.range(1));
  const bool eigen = state.range(2) != 0;
  const auto modulation = static_cast<Modulation>(state.range(3));
  const std::int64_t rows = shape.batch * shape.seq, elements = rows * shape.dim;
  const std::int64_t modulated_seq = modulation == Modulation::per_token ? shape.seq : 1;
  // x read and out written; per-token scale and shift (in T) read as well.
  const std::int64_t bytes = (modulation == Modulation::per_token ? 4 : 2) * elements *
                             static_cast<std::int64_t>(sizeof(T));
  ColdBuffers<T> x(elements, bytes), out(elements, bytes, 2);
  const std::int64_t modulation_elements = shape.batch * modulated_seq * shape.dim;
  ColdBuffers<T> scale(modulation_elements, bytes, 3), shift(modulation_elements, bytes, 4);
  std::vector<float> weight(shape.dim, 1.1f), bias(shape.dim, 0.1f), scale_f32(shape.dim, 0.2f),
      shift_f32(shape.dim, -0.3f);
  set_num_threads(threads);
  const auto tensor = [&](T* data, std::int64_t seq) {
    return view(data, {shape.batch, seq, shape.dim});
  };
  int iteration = 0;
  for (auto _ : state) {
    T* xs = x.copy(iteration);
    T* ys = out.copy(iteration);
    if (eigen) {
      eigen_layer_norm_scale_shift(xs, weight.data(), bias.data(), scale_f32.data(),
                                   shift_f32.data(), ys, rows, shape.dim, threads);
    } else if (modulation == Modulation::none) {
      layer_norm(tensor(xs, shape.seq), view(weight.data(), {shape.dim}),
                 view(bias.data(), {shape.dim}), kEps, tensor(ys, shape.seq));
    } else {
      layer_norm_scale_shift(
          tensor(xs, shape.seq), view(weight.data(), {shape.dim}), view(bias.data(), {shape.dim}),
          tensor(scale.copy(iteration), modulated_seq),
          tensor(shift.copy(iteration), modulated_seq), kEps, tensor(ys, shape.seq));
    }
    ++iteration;
    benchmark::ClobberMemory();
  }
  static const char* const kModulationNames[] = {"layer_norm", "per-batch", "per-token"};
  state.SetLabel(std::string(eigen ? "eigen " : "ditops ") + dtype_name(detail::dtype_of<T>()) +
                 " [" + std::to_string(shape.batch) + ", " + std::to_string(shape.seq) + ", " +
                 std::to_string(shape.dim) + "] " + kModulationNames[state.range(3)]);
  report_bandwidth(state, static_cast<double>(bytes), threads);
}

// Args: shape index, threads, baseline (0 = ditops, 1 = Eigen), misaligned (short rows only,
// where every row has partial cache lines at both ends).
void norm_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"shape", "threads", "eigen", "misaligned"});
  for (int shape = 0; shape < kShapeCount; ++shape) {
    for (int threads : {1, 2}) {
      for (int eigen : {0, 1}) b->Args({shape, threads, eigen, 0});
      if (shape == 1) b->Args({shape, threads, 0, 1});
    }
  }
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}
void fused_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"shape", "threads", "misaligned"});
  for (int shape = 0; shape < kShapeCount; ++shape) {
    for (int threads : {1, 2}) {
      b->Args({shape, threads, 0});
      if (shape == 1) b->Args({shape, threads, 1});
    }
  }
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

// Args: shape index, threads, baseline (0 = ditops, 1 = Eigen: per-batch modulation only),
// modulation (Modulation).
void layer_norm_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"shape", "threads", "eigen", "modulation"});
  for (int shape = 0; shape < kLayerNormShapeCount; ++shape) {
    for (int threads : {1, 2}) {
      for (int modulation : {0, 1, 2}) b->Args({shape, threads, 0, modulation});
      b->Args({shape, threads, 1, 1});
    }
  }
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK_TEMPLATE(BM_rms_norm, float)->Apply(norm_args);
BENCHMARK_TEMPLATE(BM_rms_norm, bf16)->Apply(norm_args);
BENCHMARK_TEMPLATE(BM_rms_norm, f16)->Apply(norm_args);
BENCHMARK_TEMPLATE(BM_add_rms_norm, float)->Apply(fused_args);
BENCHMARK_TEMPLATE(BM_add_rms_norm, bf16)->Apply(fused_args);
BENCHMARK_TEMPLATE(BM_add_rms_norm, f16)->Apply(fused_args);
BENCHMARK_TEMPLATE(BM_layer_norm_scale_shift, float)->Apply(layer_norm_args);
BENCHMARK_TEMPLATE(BM_layer_norm_scale_shift, bf16)->Apply(layer_norm_args);
BENCHMARK_TEMPLATE(BM_layer_norm_scale_shift, f16)->Apply(layer_norm_args);

}  // namespace
}  // namespace ditops::bench
