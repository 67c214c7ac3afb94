#include "bench/limits.hpp"

#include <immintrin.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include "ops/core/isa.hpp"

namespace ditops::bench {
namespace {

using Clock = std::chrono::steady_clock;

/// Runs loop(iterations) on `threads` threads at once; returns total operations per second.
template <class Loop>
double run_parallel(int threads, std::int64_t iterations, Loop loop) {
  double total_ops = 0;
  const auto start = Clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : total_ops)
  total_ops += loop(iterations);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return total_ops / seconds;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

/// Median of `runs` compute probes of ~50 ms each (after one warm-up that also lets the clock
/// settle at its vector frequency).
template <class Loop>
double compute_probe(int threads, Loop loop) {
  constexpr std::int64_t kIterations = 4'000'000;
  run_parallel(threads, kIterations / 4, loop);
  std::vector<double> rates;
  for (int run = 0; run < 5; ++run) rates.push_back(run_parallel(threads, kIterations, loop));
  return median(rates);
}

}  // namespace

std::int64_t last_level_cache_bytes() {
  long bytes = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (bytes <= 0) bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return std::max<std::int64_t>(bytes, 32 << 20);
}

int copies_to_defeat_cache(std::int64_t bytes) {
  const std::int64_t needed = 2 * last_level_cache_bytes();
  return static_cast<int>(std::max<std::int64_t>(2, (needed + bytes - 1) / bytes));
}

PeakProbe fma_probe() {
  switch (core::active_isa()) {
    case core::Isa::avx512:
      return {fma_loop_avx512, "zmm vfmadd231ps", 32};
    case core::Isa::avx2:
      return {fma_loop_avx2, "ymm vfmadd231ps", 16};
    default:
      return {};  // the scalar and sse4.2 kernels have no FMA
  }
}

PeakProbe bf16_probe() {
  if (core::kernel_variant() != core::kAvx512Bf16Variant) return {};
  return {bf16_loop_avx512, "zmm vdpbf16ps", 64};
}

PeakProbe int8_probe() {
  if (core::kernel_variant() == core::kAvx512Bf16Variant) {
    return {vnni_loop_avx512, "zmm vpdpbusd", 128};
  }
  if (core::kernel_variant() == core::kAvx2VnniVariant) {
    return {vnni_loop_avx2, "ymm vpdpbusd (AVX-VNNI)", 64};
  }
  if (core::active_isa() >= core::Isa::avx2) {
    // Counted per vpmaddubsw (with its vpmaddwd and vpaddd): 32 multiply-adds.
    return {int8_loop_avx2, "ymm vpmaddubsw + vpmaddwd + vpaddd", 64};
  }
  return {};
}

double run_probe(const PeakProbe& probe, int threads) {
  return probe.loop == nullptr ? 0 : compute_probe(threads, probe.loop);
}

double probe_triad(int threads) {
  // a = b + s*c over arrays far beyond the last-level cache; 12 bytes counted per element
  // (two reads, one write; write-allocate traffic not counted, as STREAM does). Run twice, with
  // ordinary stores and with streaming (non-temporal) stores, which skip the read-for-ownership
  // of `a`: the limit is the faster, so kernels that stream their output (RMSNorm, RoPE above
  // 32 MiB) are measured against what the memory can really do, not against a slower variant.
  // The three arrays together span twice the last-level cache; 16 floats per step, so the
  // count is a multiple of 16 and each array 64-byte aligned (streaming stores need 16).
  const std::int64_t elements =
      std::max<std::int64_t>(2 * last_level_cache_bytes() / 12, 16 << 20) / 16 * 16;
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  auto allocate = [&] {
    return std::unique_ptr<float, Free>(static_cast<float*>(std::aligned_alloc(64, elements * 4)));
  };
  auto a = allocate(), b = allocate(), c = allocate();
  float *pa = a.get(), *pb = b.get(), *pc = c.get();
#pragma omp parallel for num_threads(threads) schedule(static)
  for (std::int64_t i = 0; i < elements; ++i) {  // first touch from the threads that stream
    pa[i] = 0.f;
    pb[i] = 1.f;
    pc[i] = 2.f;
  }
  double best = 0;
  for (bool streaming : {false, true}) {
    std::vector<double> rates;
    for (int run = 0; run < 5; ++run) {
      const auto start = Clock::now();
      if (streaming) {
        const __m128 half = _mm_set1_ps(0.5f);
#pragma omp parallel for num_threads(threads) schedule(static)
        for (std::int64_t i = 0; i < elements; i += 4) {
          _mm_stream_ps(pa + i,
                        _mm_add_ps(_mm_load_ps(pb + i), _mm_mul_ps(half, _mm_load_ps(pc + i))));
        }
        _mm_sfence();
      } else {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (std::int64_t i = 0; i < elements; ++i) pa[i] = pb[i] + 0.5f * pc[i];
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      rates.push_back(12.0 * static_cast<double>(elements) / seconds);
    }
    best = std::max(best, median(rates));
  }
  return best;
}

namespace {

/// `iterations` x 16 dependent adds: 16 cycles per iteration (the loop's own increment and
/// branch run beside the chain).
double add_chain_loop(std::int64_t iterations) {
  std::uint64_t value = 0;
  for (std::int64_t i = 0; i < iterations; ++i) {
    __asm__ volatile(
        "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
        "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
        "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\t"
        "add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0"
        : "+r"(value));
  }
  return 16.0 * static_cast<double>(iterations);
}

}  // namespace

double probe_clock(int threads) { return compute_probe(threads, add_chain_loop) / threads; }

double instructions_per_cycle(const PeakProbe& probe, double rate, int threads, double clock) {
  if (probe.loop == nullptr || clock <= 0) return 0;
  return rate / (threads * clock * probe.ops_per_instruction);
}

const Limits& measured_limits(int threads) {
  static std::mutex mutex;
  static std::map<int, Limits> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(threads);
  if (it == cache.end()) {
    it = cache
             .emplace(threads,
                      Limits{run_probe(fma_probe(), threads), run_probe(bf16_probe(), threads),
                             run_probe(int8_probe(), threads), probe_triad(threads)})
             .first;
  }
  return it->second;
}

}  // namespace ditops::bench
