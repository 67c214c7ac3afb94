#pragma once
// The attention family's kernel table: the flash kernels and the K / V widening the flash driver
// and packing run (flash_kernel.cpp), merge_attention_states' row kernel (merge_kernel.cpp) and
// the int8 backend's kernels (int8_kernel.cpp), one struct per kernel variant. Built once, in
// flash_driver.cpp; read by flash_driver.cpp, packing.cpp, merge.cpp and int8.cpp.

#include "ops/attention/attention_kernel.hpp"
#include "ops/attention/int8_kernel.hpp"
#include "ops/attention/merge_kernel.hpp"
#include "ops/core/isa.hpp"

namespace ditops::attention {

/// The attention kernels of one variant (the member types: any instantiation's, so they follow
/// the declarations; qualified, since the members take the kernels' names).
struct AttentionKernels {
  // The flash driver's and packing's.
  decltype(&attention::flash_task<xsimd::sse2>) flash_task;
  decltype(&attention::flash_merge_splits<xsimd::sse2>) flash_merge_splits;
  decltype(&attention::widen_row<xsimd::sse2>) widen_row;
  decltype(&attention::transpose_k_panel<xsimd::sse2>) transpose_k_panel;
  // merge_attention_states'.
  decltype(&attention::merge_attention_rows<xsimd::sse2>) merge_attention_rows;
  // The int8 backend's.
  decltype(&attention::int8_quantize_kv_head<xsimd::sse2>) int8_quantize_kv_head;
  decltype(&attention::int8_attention_task<xsimd::sse2>) int8_attention_task;
};

/// The kernels of the variant this process runs. The table is constexpr: built at compile
/// time, read without an initialization guard.
/// Defined in flash_driver.cpp.
const AttentionKernels& attention_kernels() noexcept;

}  // namespace ditops::attention
