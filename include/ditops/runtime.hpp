#pragma once
// Threads and CPU features.

#include <string>

namespace ditops {

/// Threads used by every operator from now on; 0 = one per physical core (hwloc).
/// Values below 0 or above 4096 (the cap DITOPS_NUM_THREADS has too) throw Error.
void set_num_threads(int n);
int num_threads();

/// Frees the scratch memory the library keeps for the calling thread between calls (packed
/// attention K and V, quantized linear inputs, MLA decode buffers: each grown to the largest
/// call so far). The next call allocates again. Other threads' scratch is freed when they exit.
void release_thread_scratch() noexcept;

struct CpuInfo {
  std::string isa;  ///< level dispatch uses: "scalar", "sse4.2", "avx2", "avx512"
  bool avx512, avx512_vnni, avx512_bf16, avx2, f16c;
  /// bf16 GEMMs run at twice the fp32 FMA rate or more: vdpbf16ps at the FMA's instruction rate
  /// (AMD Zen 4 and later; Intel's Xeons run it at half that), or AMX-BF16 tiles the OS has
  /// enabled. There, a bf16 GEMM on them (PyTorch's, through oneDNN) beats ditops' FLOAT layers,
  /// which widen bf16 weights to fp32.
  bool bf16_dot_full_rate;
  int physical_cores;
};
/// Features of the running CPU; `isa` is capped by DITOPS_ISA.
CpuInfo cpu_info();

}  // namespace ditops
