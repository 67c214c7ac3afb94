#pragma once
// The machine's measured limits (bench/limits.cpp): every benchmark reports its throughput as a
// fraction of these, measured in the same process rather than assumed from a data sheet. The
// compute probes follow dispatch (DITOPS_ISA caps them as it caps the kernels), so a capped run
// reports what a CPU of that level would; a limit the CPU (as capped) lacks is 0, and fractions
// of it are left out.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ditops::bench {

struct Limits {
  double fma_flops;   ///< FP32 FMA peak, FLOP/s (zmm on avx512, ymm on avx2; 0 below avx2)
  double bf16_flops;  ///< AVX512-BF16 vdpbf16ps peak, FLOP/s (0 without the BF16/VNNI variant)
  double int8_ops;    ///< int8 dot-product peak, OP/s (2 per u8 x s8 multiply-add): vpdpbusd
                      ///< with the AVX512-VNNI variant, else vpmaddubsw on avx2 and up; 0 below
  double bandwidth;   ///< STREAM-triad bandwidth, bytes/s, out of cache; best of ordinary and
                      ///< streaming stores
};

/// Probes for `threads` threads (median of several short runs); cached per thread count.
const Limits& measured_limits(int threads);

/// A compute-peak probe as this process's dispatch picks it: the loop that measures it and the
/// instructions the loop runs, or no loop where the CPU (as capped) lacks them.
struct PeakProbe {
  double (*loop)(std::int64_t iterations) = nullptr;
  const char* instructions = "";
  int ops_per_instruction = 0;  ///< FLOP or OP of one instruction (zmm vfmadd231ps: 32)
};
PeakProbe fma_probe();
PeakProbe bf16_probe();
PeakProbe int8_probe();

/// Operations per second of `probe` on `threads` threads; 0 when it has no loop.
double run_probe(const PeakProbe& probe, int threads);
/// STREAM-triad bytes per second on `threads` threads.
double probe_triad(int threads);
/// One core's clock, cycles per second, while `threads` threads each run a chain of dependent
/// integer adds (one cycle of latency on every x86 core): with it, a peak becomes instructions
/// per cycle per core, which says how many vector units of that kind a core has (two 512-bit
/// FMA ports on Sapphire Rapids and later Xeons, one on Zen 4, whose 256-bit units take two
/// cycles per zmm). The clock of scalar code: a CPU that slows down for wide vectors would show
/// a fraction below its unit count.
double probe_clock(int threads);
/// `probe`'s instructions per cycle per core at `rate` (operations per second on `threads`
/// threads) and `clock` (probe_clock); 0 without a probe.
double instructions_per_cycle(const PeakProbe& probe, double rate, int threads, double clock);

/// Bytes of the last-level cache (sysconf), at least 32 MiB.
std::int64_t last_level_cache_bytes();

/// Enough copies of a working set of `bytes` that cycling through them never hits in the
/// last-level cache (total >= 2x its size): the XNNPACK cold-cache method.
int copies_to_defeat_cache(std::int64_t bytes);

/// Repeats X(i) for the twelve accumulator chains of the peak probes (named variables, not an
/// array: an array of accumulators ends up on the stack).
#define DITOPS_TWELVE(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

/// Marks the twelve accumulators acc0..acc11 as read and written, so the compiler can neither
/// drop nor merge the chains ("v": any vector register the ISA has).
#define DITOPS_KEEP(acc)                                                                   \
  __asm__ volatile(""                                                                      \
                   : "+v"(acc##0), "+v"(acc##1), "+v"(acc##2), "+v"(acc##3), "+v"(acc##4), \
                     "+v"(acc##5), "+v"(acc##6), "+v"(acc##7), "+v"(acc##8), "+v"(acc##9), \
                     "+v"(acc##10), "+v"(acc##11))

/// Kernels of the probes, per ISA (bench/peak_avx512.cpp, bench/peak_avx2.cpp,
/// bench/peak_avxvnni.cpp). Each runs
/// `iterations` of a dependency-free block and returns the operations performed.
double fma_loop_avx512(std::int64_t iterations);
double bf16_loop_avx512(std::int64_t iterations);
double vnni_loop_avx512(std::int64_t iterations);
double fma_loop_avx2(std::int64_t iterations);
double int8_loop_avx2(std::int64_t iterations);
double vnni_loop_avx2(std::int64_t iterations);

}  // namespace ditops::bench
