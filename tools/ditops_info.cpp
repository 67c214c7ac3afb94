// ditops-info: what this machine offers and what ditops will use on it.

#include <hwloc.h>

#include <cstdio>
#include <cstdlib>
#include <ditops/runtime.hpp>
#include <string>
#include <tuple>

#include "ops/core/isa.hpp"

int main() {
  const ditops::CpuInfo info = ditops::cpu_info();
  std::printf("ditops-info\n");
  std::printf("  isa (dispatch)      %s%s\n", info.isa.c_str(),
              info.isa != ditops::core::isa_name(ditops::core::supported_isa())
                  ? "  (capped by DITOPS_ISA)"
                  : "");
  std::printf("  kernel variant      %s\n", ditops::core::kernel_variant_name());
  std::printf("  best supported      %s\n", ditops::core::isa_name(ditops::core::supported_isa()));
  std::printf("  avx512 %d  avx512_vnni %d  avx512_bf16 %d  avx2 %d  f16c %d\n", info.avx512,
              info.avx512_vnni, info.avx512_bf16, info.avx2, info.f16c);
  const std::string avx_vnni = ditops::core::avx_vnni_blocker(
      ditops::core::avx_vnni_supported(), std::getenv("DITOPS_ISA"), ditops::core::active_isa());
  if (avx_vnni.empty()) {
    std::printf("  %-19s %s\n", "avx-vnni", "int8 kernels on vpdpbusd ymm (avx2+vnni variant)");
  } else {
    std::printf("  %-19s not used: %s\n", "avx-vnni", avx_vnni.c_str());
  }
  const ditops::core::AmxSupport amx = ditops::core::amx_support();
  std::printf("  amx_tile %d  amx_int8 %d  amx_bf16 %d  bf16_dot_full_rate %d\n", amx.tile,
              amx.int8, amx.bf16, info.bf16_dot_full_rate);
  using ditops::core::AmxUnit;
  for (const auto& [unit, name, use] :
       {std::tuple{AmxUnit::int8, "amx int8", "W8A8 linear layers and int8 attention on tiles"},
        std::tuple{AmxUnit::bf16, "amx bf16", "bf16 linear layers and flash_bf16 on tiles"}}) {
    if (ditops::core::amx_usable(unit)) {
      std::printf("  %-19s %s\n", name, use);
    } else {
      std::printf("  %-19s not used: %s\n", name, ditops::core::amx_reason(unit));
    }
  }
  std::printf("  physical cores      %d\n", info.physical_cores);
  std::printf("  threads             %d\n", ditops::num_threads());

  hwloc_topology_t topology;
  if (hwloc_topology_init(&topology) == 0 && hwloc_topology_load(topology) == 0) {
    const int depth = hwloc_topology_get_depth(topology);
    std::printf("  hwloc topology\n");
    for (int level = 0; level < depth; ++level) {
      const int count = hwloc_get_nbobjs_by_depth(topology, level);
      hwloc_obj_t first = hwloc_get_obj_by_depth(topology, level, 0);
      char type[64];
      hwloc_obj_type_snprintf(type, sizeof type, first, 1);
      char attributes[128] = "";
      hwloc_obj_attr_snprintf(attributes, sizeof attributes, first, " ", 0);
      std::printf("    %-10s x%-4d %s\n", type, count, attributes);
    }
    hwloc_topology_destroy(topology);
  }
  return 0;
}
