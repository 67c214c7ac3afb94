#pragma once
// Threads and CPU features.

#include <string>

namespace ditops {

/// Threads used by every operator from now on; 0 = one per physical core (hwloc).
/// Values below 0 or above 4096 (the cap DITOPS_NUM_THREADS has too) throw Error.
void set_num_threads(int n);
int num_threads();

struct CpuInfo {
  std::string isa;  ///< level dispatch uses: "scalar", "sse4.2", "avx2", "avx512"
  bool avx512, avx512_vnni, avx512_bf16, avx2, f16c;
  int physical_cores;
};
/// Features of the running CPU; `isa` is capped by DITOPS_ISA.
CpuInfo cpu_info();

}  // namespace ditops
