// cfg_combine on out-of-cache tensors (a Wan 720p latent, [16, 21, 90, 160]: the guidance step
// of every denoising step), beside the Eigen expression a user would write, with the same
// threads, in the same process; on line-aligned tensors and (misaligned = 1) on tensors 16
// bytes past a line, where glibc's malloc and numpy put them.

#include <omp.h>

#include <Eigen/Core>
#include <ditops/guidance.hpp>
#include <ditops/runtime.hpp>

#include "bench/support.hpp"

namespace ditops::bench {
namespace {

constexpr float kScale = 5.f;
constexpr std::int64_t kRows = 16 * 21 * 90, kDim = 160;

/// uncond + scale * (cond - uncond), one Eigen expression per thread's share of the elements.
template <class T>
void eigen_cfg_combine(const T* cond, const T* uncond, T* out, std::int64_t elements, int threads) {
  using S = EigenScalar<T>;
  using Array = Eigen::Array<S, Eigen::Dynamic, 1>;
#pragma omp parallel num_threads(threads)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    const std::int64_t begin = elements * t / n, end = elements * (t + 1) / n;
    const Eigen::Map<const Array> c(reinterpret_cast<const S*>(cond) + begin, end - begin);
    const Eigen::Map<const Array> u(reinterpret_cast<const S*>(uncond) + begin, end - begin);
    Eigen::Map<Array> y(reinterpret_cast<S*>(out) + begin, end - begin);
    const auto uf = u.template cast<float>();
    y = (uf + kScale * (c.template cast<float>() - uf)).template cast<S>();
  }
}

template <class T>
void BM_cfg_combine(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const bool eigen = state.range(1) != 0;
  const std::int64_t skip = skip_elements<T>(state, 2);
  const std::int64_t elements = kRows * kDim;
  const std::int64_t bytes = 3 * elements * static_cast<std::int64_t>(sizeof(T));
  ColdBuffers<T> cond(elements + skip, bytes), uncond(elements + skip, bytes, 2),
      out(elements + skip, bytes, 3);
  set_num_threads(threads);
  int iteration = 0;
  for (auto _ : state) {
    const T* c = cond.copy(iteration) + skip;
    const T* u = uncond.copy(iteration) + skip;
    T* y = out.copy(iteration++) + skip;
    if (eigen) {
      eigen_cfg_combine(c, u, y, elements, threads);
    } else {
      cfg_combine(view(c, {kRows, kDim}), view(u, {kRows, kDim}), kScale, view(y, {kRows, kDim}));
    }
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(eigen ? "eigen " : "ditops ") + dtype_name(detail::dtype_of<T>()) +
                 " [16, 21, 90, 160]" + (skip ? " misaligned" : ""));
  report_bandwidth(state, static_cast<double>(bytes), threads);
}

// Args: threads, baseline (0 = ditops, 1 = Eigen), misaligned.
void guidance_args(benchmark::internal::Benchmark* b) {
  b->ArgNames({"threads", "eigen", "misaligned"});
  for (int threads : {1, 2})
    for (int eigen : {0, 1})
      for (int misaligned : {0, 1}) b->Args({threads, eigen, misaligned});
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK_TEMPLATE(BM_cfg_combine, float)->Apply(guidance_args);
BENCHMARK_TEMPLATE(BM_cfg_combine, bf16)->Apply(guidance_args);

}  // namespace
}  // namespace ditops::bench
