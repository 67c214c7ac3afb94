// RMSNorm on out-of-cache tensors: ditops beside an Eigen-expression baseline run with the same
// threads (row blocks per OpenMP thread), in the same process. Shapes: [8192, 3072] (an LLM /
// DiT hidden state), FLUX's per-head QK-norm [4608 * 24, 128] and a wider hidden state
// [4096, 5120]. With misaligned = 1 every tensor starts 16 bytes past a cache line, as the
// large allocations of std::vector (glibc's malloc) do, where framework tensors are aligned.

#include <omp.h>

#include <Eigen/Core>
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

BENCHMARK_TEMPLATE(BM_rms_norm, float)->Apply(norm_args);
BENCHMARK_TEMPLATE(BM_rms_norm, bf16)->Apply(norm_args);
BENCHMARK_TEMPLATE(BM_rms_norm, f16)->Apply(norm_args);
BENCHMARK_TEMPLATE(BM_add_rms_norm, float)->Apply(fused_args);
BENCHMARK_TEMPLATE(BM_add_rms_norm, bf16)->Apply(fused_args);
BENCHMARK_TEMPLATE(BM_add_rms_norm, f16)->Apply(fused_args);

}  // namespace
}  // namespace ditops::bench
