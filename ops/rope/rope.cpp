// Public entry rotary_position_embedding: validate, map cos/sin onto x's rows, run in parallel.

#include <cstdint>
#include <ditops/rope.hpp>

#include "ops/core/check.hpp"
#include "ops/core/isa.hpp"
#include "ops/core/threads.hpp"
#include "ops/rope/kernels.hpp"
#include "ops/rope/rope_kernel.hpp"
#include "ops/rope/rope_tables.hpp"

namespace ditops {
namespace rope {
namespace {

template <class Arch>
constexpr RopeKernels rope_kernels_of() {
  return {&rope_rows<Arch>, &norm_rope_groups<Arch>};
}

}  // namespace

const RopeKernels& rope_kernels() noexcept {
  static constexpr core::IsaTable<RopeKernels> table = DITOPS_KERNEL_TABLE(rope_kernels_of);
  return table.get();
}

}  // namespace rope

namespace {

constexpr std::int64_t kCacheLineBytes = 64;

using core::Arg;

}  // namespace

void rotary_position_embedding(const TensorView& x, const TensorView& cos, const TensorView& sin,
                               const TensorView& out, RotatedMode mode, bool head_first) {
  constexpr const char* kCall = "rotary_position_embedding";
  const Arg x_arg{kCall, "x", x}, cos_arg{kCall, "cos", cos}, sin_arg{kCall, "sin", sin},
      out_arg{kCall, "out", out};
  rope::check_rotated(x_arg, out_arg, mode);
  const auto tables = rope::check_tables(cos_arg, sin_arg, x_arg, out_arg, head_first ? 2 : 1);

  rope::RopeProblem problem;
  problem.dtype = x.dtype;
  problem.table_dtype = cos.dtype;
  problem.dim = x.shape[3];
  problem.mode = mode;
  problem.rows = core::row_layout_of(x);
  problem.rows.strides[rope::kOut] = core::row_layout_of(out).strides[0];
  problem.rows.strides[rope::kCos] = tables.cos;
  problem.rows.strides[rope::kSin] = tables.sin;
  problem.x = x.data;
  problem.out = out.data;
  problem.cos = cos.data;
  problem.sin = sin.data;
  if (problem.rows.rows == 0 || problem.dim == 0) return;

  const auto kernel = rope::rope_kernels().rope_rows;
  const std::int64_t bytes = problem.rows.rows * problem.dim * dtype_size(x.dtype) * 2;
  // Streaming saves reading each line of out for ownership, decided by the traffic (x read and
  // out written) for f32: rows that fill whole cache lines stream from the threshold of the
  // traffic, and so do rows whose vectors the kernel joins into aligned ones
  // (simd::ShiftedStreamWriter: f32 BSND 16 bytes past a line, 1 thread, 8.5 ms joined vs
  // 12.5 ms not streamed). 16-bit rows, whose conversions make them compute-bound on AVX2, are
  // not joined, and stream from the threshold of the bytes written: at [1, 4096, 24, 128]
  // (24 MiB written) on AMD Zen 3, f16 rows streamed in place (16-byte streaming stores) took
  // 1.1-1.5x as long as rows not streamed, joined ones about 1.3x. Rows that share lines and
  // are staged (simd::LineStager), whose staging costs about what streaming saves (0.93x
  // streamed), also stream from the threshold of the bytes written.
  bool whole_lines = x.dtype == DType::f32 &&
                     reinterpret_cast<std::uintptr_t>(out.data) % kCacheLineBytes == 0 &&
                     problem.dim * dtype_size(x.dtype) % kCacheLineBytes == 0;
  for (int d = 0; d < problem.rows.dims; ++d) {
    whole_lines &= problem.rows.strides[rope::kOut][d] * dtype_size(x.dtype) % kCacheLineBytes == 0;
  }
  problem.stream_joined = core::use_streaming_stores(bytes) && x.dtype == DType::f32;
  problem.stream = whole_lines ? problem.stream_joined : core::use_streaming_stores(bytes / 2);
  core::parallel_ranges(
      problem.rows.rows, core::threads_for_bytes(bytes),
      [&](std::int64_t begin, std::int64_t end, int) { kernel(problem, begin, end); });
}

}  // namespace ditops
