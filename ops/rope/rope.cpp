// Public entry rotary_position_embedding: validate, map cos/sin onto x's rows, run in parallel.

#include <algorithm>
#include <ditops/rope.hpp>
#include <type_traits>

#include "ops/core/check.hpp"
#include "ops/core/isa.hpp"
#include "ops/core/threads.hpp"
#include "ops/rope/rope_kernel.hpp"

namespace ditops {
namespace {

using core::Arg;

/// Strides that walk `table` (cos or sin) along x's three leading dims: [S, D] follows x's
/// sequence dim only; a 4-D table follows each dim it does not broadcast (extent 1).
std::array<std::int64_t, kMaxRank> table_strides(const Arg& table, const Arg& x, int seq_dim) {
  const TensorView& t = table.view;
  core::check_view(table, 2, 4);
  if (t.rank == 3) {
    core::fail(table.call, std::string(table.name) + " has rank 3, expected 2 ([S, D]) or 4");
  }
  core::check_dim(table, t.rank - 1, x, 3);
  std::array<std::int64_t, kMaxRank> strides{};
  if (t.rank == 2) {
    core::check_dim(table, 0, x, seq_dim);
    strides[seq_dim] = t.strides[0];
    return strides;
  }
  for (int d = 0; d < 3; ++d) {
    if (t.shape[d] == x.view.shape[d]) {
      strides[d] = t.shape[d] == 1 ? 0 : t.strides[d];
    } else if (t.shape[d] == 1) {
      strides[d] = 0;
    } else {
      core::fail(table.call, std::string(table.name) + ".shape[" + std::to_string(d) + "] (" +
                                 std::to_string(t.shape[d]) + ") must be 1 or equal x.shape[" +
                                 std::to_string(d) + "] (" + std::to_string(x.view.shape[d]) + ")");
    }
  }
  return strides;
}

/// `base` moved by `bytes` (base: void* or const void*).
template <class Void>
Void* byte_offset(Void* base, std::int64_t bytes) {
  using Byte = std::conditional_t<std::is_const_v<Void>, const char, char>;
  return static_cast<Byte*>(base) + bytes;
}

/// The problem without its first `positions` positions along leading dim `seq_dim`.
rope::RopeProblem skip_positions(rope::RopeProblem problem, int seq_dim, std::int64_t positions) {
  const auto bytes = [&](int operand, DType dtype) {
    return positions * problem.rows.strides[operand][seq_dim] * dtype_size(dtype);
  };
  problem.x = byte_offset(problem.x, bytes(rope::kX, problem.dtype));
  problem.out = byte_offset(problem.out, bytes(rope::kOut, problem.dtype));
  problem.cos = byte_offset(problem.cos, bytes(rope::kCos, problem.table_dtype));
  problem.sin = byte_offset(problem.sin, bytes(rope::kSin, problem.table_dtype));
  return problem;
}

}  // namespace

void rotary_position_embedding(const TensorView& x, const TensorView& cos, const TensorView& sin,
                               const TensorView& out, RotatedMode mode, bool head_first) {
  constexpr const char* kCall = "rotary_position_embedding";
  const Arg x_arg{kCall, "x", x}, cos_arg{kCall, "cos", cos}, sin_arg{kCall, "sin", sin},
      out_arg{kCall, "out", out};
  core::check_view(x_arg, 4, 4);
  core::check_dtype(x_arg, {DType::f32, DType::bf16, DType::f16});
  if (x.shape[3] % 2 != 0) {
    core::fail(kCall, "x.shape[3] (" + std::to_string(x.shape[3]) + ") must be even");
  }
  if (mode != RotatedMode::rotated_half && mode != RotatedMode::rotated_interleaved) {
    core::fail(kCall, "mode (" + std::to_string(static_cast<int>(mode)) + ") is not a RotatedMode");
  }
  core::check_view(out_arg, 4, 4);
  core::check_same_dtype(out_arg, x_arg);
  core::check_same_shape(out_arg, x_arg);
  const int seq_dim = head_first ? 2 : 1;
  const auto cos_strides = table_strides(cos_arg, x_arg, seq_dim);
  const auto sin_strides = table_strides(sin_arg, x_arg, seq_dim);
  core::check_dtype(cos_arg, {DType::f32, x.dtype});
  core::check_same_dtype(sin_arg, cos_arg);
  core::check_writable(out_arg);
  core::check_no_overlap(out_arg, x_arg, /*identical_ok=*/true);
  core::check_no_overlap(out_arg, cos_arg, false);
  core::check_no_overlap(out_arg, sin_arg, false);

  rope::RopeProblem problem;
  problem.dtype = x.dtype;
  problem.table_dtype = cos.dtype;
  problem.dim = x.shape[3];
  problem.mode = mode;
  problem.rows = core::row_layout_of(x);
  problem.rows.strides[rope::kOut] = core::row_layout_of(out).strides[0];
  problem.rows.strides[rope::kCos] = cos_strides;
  problem.rows.strides[rope::kSin] = sin_strides;
  problem.x = x.data;
  problem.out = out.data;
  problem.cos = cos.data;
  problem.sin = sin.data;
  if (problem.rows.rows == 0 || problem.dim == 0) return;

  static const core::IsaTable<decltype(&rope::rope_rows<xsimd::sse2>)> kernels =
      DITOPS_ISA_TABLE(rope::rope_rows);
  const auto kernel = kernels.get();
  const std::int64_t bytes = problem.rows.rows * problem.dim * dtype_size(x.dtype) * 2;
  problem.stream = core::use_streaming_stores(bytes / 2);
  const int threads = core::threads_for_bytes(bytes);
  const auto run = [&](const rope::RopeProblem& part) {
    core::parallel_ranges(part.rows.rows, threads, [&](std::int64_t begin, std::int64_t end, int) {
      kernel(part, begin, end);
    });
  };

  // BNSD with tables shared by every head: walked in [B, N, S] order, each row would fetch its
  // own cos/sin row from far caches or memory, as much traffic again as x and out. Walk the rows
  // in [B, S / P, N, P] order instead: blocks of P positions (about 4 KiB of x per head, P
  // rows of the tables) of every head, so the block's tables serve all heads from L1 and each
  // head's P rows are still one contiguous run. Positions past the last whole block keep the
  // plain order.
  const std::int64_t heads = x.shape[1], seq = x.shape[2];
  const std::int64_t block = std::max<std::int64_t>(1, 4096 / (problem.dim * dtype_size(x.dtype)));
  const std::int64_t blocked = seq / block * block;
  const bool shared_tables =
      problem.rows.strides[rope::kCos][1] == 0 && problem.rows.strides[rope::kSin][1] == 0;
  if (!head_first || !shared_tables || heads == 1 || block == 1 || blocked == 0)
    return run(problem);
  rope::RopeProblem blocks = problem;
  blocks.rows.dims = 4;
  blocks.rows.shape = {x.shape[0], blocked / block, heads, block};
  for (int operand = 0; operand < core::kMaxRowOperands; ++operand) {
    const auto& plain = problem.rows.strides[operand];
    blocks.rows.strides[operand] = {plain[0], block * plain[2], plain[1], plain[2]};
  }
  blocks.rows.rows = x.shape[0] * heads * blocked;
  run(blocks);
  if (blocked == seq) return;
  rope::RopeProblem rest = skip_positions(problem, 2, blocked);
  rest.rows.shape[2] = seq - blocked;
  rest.rows.rows = x.shape[0] * heads * (seq - blocked);
  run(rest);
}

}  // namespace ditops
