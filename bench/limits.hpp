#pragma once
// The machine's measured limits (bench/limits.cpp): every benchmark reports its throughput as a
// fraction of these, measured in the same process rather than assumed from a data sheet.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ditops::bench {

struct Limits {
  double fma_flops;   ///< FP32 FMA peak, FLOP/s (best vector ISA the CPU has)
  double bf16_flops;  ///< AVX512-BF16 vdpbf16ps peak, FLOP/s (0 if the CPU lacks it)
  double vnni_ops;    ///< AVX512-VNNI vpdpbusd peak, int8 OP/s (0 if the CPU lacks it)
  double bandwidth;   ///< STREAM-triad bandwidth, bytes/s, out of cache; best of ordinary and
                      ///< streaming stores
};

/// Probes for `threads` threads (median of several short runs); cached per thread count.
const Limits& measured_limits(int threads);

// Single probes, for the roofline benchmark. Each returns operations per second.
double probe_fma(int threads);
double probe_bf16(int threads);
double probe_vnni(int threads);
double probe_triad(int threads);

/// Bytes of the last-level cache (sysconf), at least 32 MiB.
std::int64_t last_level_cache_bytes();

/// Enough copies of a working set of `bytes` that cycling through them never hits in the
/// last-level cache (total >= 2x its size): the XNNPACK cold-cache method.
int copies_to_defeat_cache(std::int64_t bytes);

/// Repeats X(i) for the twelve accumulator chains of the peak probes (named variables, not an
/// array: an array of accumulators ends up on the stack).
#define DITOPS_TWELVE(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

/// Kernels of the probes, per ISA (bench/peak_avx512.cpp, bench/peak_avx2.cpp). Each runs
/// `iterations` of a dependency-free block and returns the operations performed.
double fma_loop_avx512(std::int64_t iterations);
double bf16_loop_avx512(std::int64_t iterations);
double vnni_loop_avx512(std::int64_t iterations);
double fma_loop_avx2(std::int64_t iterations);

}  // namespace ditops::bench
