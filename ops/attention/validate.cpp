// Validation of the attention-like calls: every argument checked before any data is touched,
// then the call described once, as an immutable value (Call) every later stage reads.

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ditops/attention.hpp>
#include <initializer_list>

#include "ops/attention/backends.hpp"
#include "ops/attention/call.hpp"
#include "ops/core/check.hpp"
#include "ops/core/log2_domain.hpp"
#include "ops/core/scratch.hpp"
#include "ops/core/threads.hpp"
#include "ops/schedule/schedule.hpp"

namespace ditops::attention {
namespace {

using core::Arg;
using core::kLog2e;
using core::numel;

/// `backend` if it is one of the enum's values: a value cast from an integer would otherwise
/// run as whatever the switches fall through to.
AttentionBackend checked_backend(const char* call, AttentionBackend backend) {
  if (backend == AttentionBackend::automatic || find_backend(backend)) return backend;
  core::fail(call, "options.backend (" + std::to_string(static_cast<int>(backend)) +
                       ") is not an AttentionBackend");
}

float checked_scale(const char* call, const std::optional<float>& scale, std::int64_t dk) {
  return core::check_softmax_scale(call, "scale", scale, 1.f / std::sqrt(static_cast<float>(dk)));
}

void check_heads(const Arg& q, int q_dim, const Arg& k, int k_dim) {
  const std::int64_t heads = q.view.shape[q_dim], kv_heads = k.view.shape[k_dim];
  if (kv_heads == 0 || heads % kv_heads != 0) {
    core::fail(q.call, std::string(q.name) + ".shape[" + std::to_string(q_dim) + "] (" +
                           std::to_string(heads) + " heads) must be a multiple of " + k.name +
                           ".shape[" + std::to_string(k_dim) + "] (" + std::to_string(kv_heads) +
                           " KV heads)");
  }
}

void check_head_dim(const Arg& arg, int dim) {
  if (arg.view.shape[dim] < 1) {
    core::fail(arg.call, std::string(arg.name) + ".shape[" + std::to_string(dim) + "] (" +
                             std::to_string(arg.view.shape[dim]) + ") must be >= 1");
  }
}

/// Bounds every size PackedKV::pack, Int8Backend and run_flash compute (packed K and V, per-row
/// outputs, LSE and split partials, per-thread scratch) with overflow checks, before any of them
/// is computed: where the bound fits int64 they do too, and aligned_array turns a size the
/// machine cannot hold into an Error. `kv_rows` and `q_rows` count rows over the whole batch.
/// (Split partials: fewer tasks than 2 x threads, so rows x splits < 4 x threads x task rows.)
void check_workspace(const char* name, const FlashProblem& p, core::CheckedSize kv_rows,
                     core::CheckedSize q_rows) {
  using core::CheckedSize;
  const std::int64_t task_rows = kMaxRowGroup * kMaxTileRows;
  const CheckedSize width = (CheckedSize(p.dk) + 31) * 2 + CheckedSize(p.dv_padded) * 4 +
                            kKvBlock * 16 + 64;  // per row, in floats, with the int8 layouts
  const CheckedSize kv_padded = kv_rows + CheckedSize(p.batch) * kKvBlock;
  const CheckedSize rows = kv_padded * p.kv_heads + q_rows * p.heads * 2 +
                           CheckedSize(task_rows) * 4 * core::kMaxThreads;
  if ((rows * width * 8).overflow) {
    core::fail(name, "q, k and v (Dk " + std::to_string(p.dk) + ", Dv " + std::to_string(p.dv) +
                         ", " + std::to_string(p.heads) +
                         " heads) need more than 2^63 bytes of workspace");
  }
}

/// Refuses an additive mask element above kAdditiveMaskLimit (+inf included): the one value
/// range whose softmax the backends would compute differently. One pass over the mask, next to
/// attention's Dk multiply-adds per mask element.
void check_additive_mask_range(const char* name, const TensorView& mask) {
  const float* data = static_cast<const float*>(mask.data);
  std::int64_t index[4] = {0, 0, 0, 0};
  const std::int64_t rows = numel(mask) / mask.shape[mask.rank - 1];
  for (std::int64_t row = 0; row < rows; ++row) {
    std::int64_t offset = 0, rest = row;
    for (int d = mask.rank - 2; d >= 0; --d) {
      index[d] = rest % mask.shape[d];
      rest /= mask.shape[d];
      offset += index[d] * mask.strides[d];
    }
    const std::int64_t last = mask.shape[mask.rank - 1];
    for (std::int64_t j = 0; j < last; ++j) {
      if (!(data[offset + j] > kAdditiveMaskLimit)) continue;
      index[mask.rank - 1] = j;
      std::string where;
      for (int d = 0; d < mask.rank; ++d) where += (d ? ", " : "") + std::to_string(index[d]);
      char text[160];
      std::snprintf(text, sizeof text,
                    "] (%g) is above 2^126: an additive mask element must be at most 2^126 "
                    "(-inf or below -2^126 excludes a key)",
                    static_cast<double>(data[offset + j]));
      core::fail(name, "attn_mask[" + where + text);
    }
  }
}

/// What both layouts fill alike: dtype, head dims, heads, data and the softmax scale (the
/// strides, lengths and outputs are the layout's own).
FlashProblem problem_of(const TensorView& q, const TensorView& k, const TensorView& v, int head_dim,
                        float scale, bool causal) {
  const int d = q.rank - 1;
  FlashProblem p;
  p.dtype = q.dtype;
  p.dk = q.shape[d];
  p.dv = v.shape[d];
  p.dv_padded = round_up(p.dv, 16);
  p.heads = q.shape[head_dim];
  p.kv_heads = k.shape[head_dim];
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.scale_log2 = scale * kLog2e;
  p.causal = causal;
  return p;
}

/// A tensor the call writes: writable, and sharing no memory with what it reads.
void check_written(const Arg& written, std::initializer_list<const Arg*> read) {
  core::check_writable(written);
  for (const Arg* in : read) {
    if (in != nullptr && numel(in->view) > 0) core::check_no_overlap(written, *in, false);
  }
}

/// options.attn_mask of a dense call, broadcast to [B, N, Sq, Sk]: its strides and kind in `p`,
/// its description for the tuner key ("none" when absent).
std::string check_mask(const char* name, const TensorView& mask, FlashProblem& p) {
  if (mask.empty() && mask.rank == 0) return "none";
  const Arg mask_arg{name, "attn_mask", mask};
  core::check_view(mask_arg, 2, 4);
  core::check_dtype(mask_arg, {DType::boolean, DType::f32});
  if (mask.rank == 3) {
    core::fail(name,
               "attn_mask has rank 3; expected rank 2 [Sq, Sk] or rank 4 "
               "[B|1, N|1, Sq|1, Sk]");
  }
  const std::int64_t want[4] = {p.batch, p.heads, p.q_len, p.kv_len};
  const int first = 4 - mask.rank;
  for (int d = 0; d < mask.rank; ++d) {
    const std::int64_t extent = mask.shape[d], expected = want[first + d];
    const bool last = d == mask.rank - 1;
    if (extent != expected && (last || extent != 1)) {
      core::fail(name, "attn_mask " + core::shape_string(mask) +
                           " is not broadcastable to [B|1, N|1, Sq|1, Sk] = [" +
                           std::to_string(p.batch) + "|1, " + std::to_string(p.heads) + "|1, " +
                           std::to_string(p.q_len) + "|1, " + std::to_string(p.kv_len) + "]");
    }
    p.mask_strides[first + d] = extent == 1 && !last ? 0 : mask.strides[d];
  }
  p.mask_strides[3] = 1;
  p.mask_kind = mask.dtype == DType::boolean ? MaskKind::boolean : MaskKind::additive;
  p.mask = mask.data;
  if (numel(mask) == 0) p.mask_kind = MaskKind::none;
  if (p.mask_kind == MaskKind::additive) check_additive_mask_range(name, mask);
  return std::string(mask.dtype == DType::boolean ? "bool" : "f32") + core::shape_string(mask);
}

void check_cu_seqlens(const char* name, const char* arg, std::span<const std::int32_t> cu,
                      std::int64_t total, const char* tensor) {
  if (cu.empty()) core::fail(name, std::string(arg) + " is empty; it needs batch + 1 entries");
  if (cu[0] != 0) {
    core::fail(name, std::string(arg) + "[0] (" + std::to_string(cu[0]) + ") must be 0");
  }
  for (std::size_t i = 1; i < cu.size(); ++i) {
    if (cu[i] < cu[i - 1]) {
      core::fail(name, std::string(arg) + "[" + std::to_string(i) + "] (" + std::to_string(cu[i]) +
                           ") is less than " + arg + "[" + std::to_string(i - 1) + "] (" +
                           std::to_string(cu[i - 1]) + "): offsets must be non-decreasing");
    }
  }
  if (cu.back() != total) {
    core::fail(name, std::string(arg) + " ends at " + std::to_string(cu.back()) + " but " + tensor +
                         ".shape[0] is " + std::to_string(total));
  }
}

}  // namespace

Call validate_dense(const char* name, const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView* out, const AttentionOptions& options) {
  const Arg q_arg{name, "q", q}, k_arg{name, "k", k}, v_arg{name, "v", v};
  const int seq_dim = options.head_first ? 2 : 1, head_dim = options.head_first ? 1 : 2;
  core::check_view(q_arg, 4, 4);
  core::check_dtype(q_arg, {DType::f32, DType::bf16, DType::f16});
  for (const Arg* arg : {&k_arg, &v_arg}) {
    core::check_view(*arg, 4, 4);
    core::check_same_dtype(*arg, q_arg);
  }
  core::check_dim(k_arg, 0, q_arg, 0);
  core::check_dim(v_arg, 0, q_arg, 0);
  core::check_dim(k_arg, 3, q_arg, 3);
  core::check_dim(v_arg, seq_dim, k_arg, seq_dim);
  core::check_dim(v_arg, head_dim, k_arg, head_dim);
  check_head_dim(q_arg, 3);
  check_head_dim(v_arg, 3);
  check_heads(q_arg, head_dim, k_arg, head_dim);

  Call call;
  call.scale = checked_scale(name, options.scale, q.shape[3]);
  FlashProblem& p = call.problem;
  p = problem_of(q, k, v, head_dim, call.scale, options.causal);
  p.batch = q.shape[0];
  p.q_len = q.shape[seq_dim];
  p.kv_len = k.shape[seq_dim];
  auto strides_of = [&](const TensorView& t) {
    return Strides{t.strides[0], t.strides[seq_dim], t.strides[head_dim]};
  };
  p.q_strides = strides_of(q);
  p.k_strides = strides_of(k);
  p.v_strides = strides_of(v);
  call.mask = check_mask(name, options.attn_mask, p);

  const Arg mask_arg{name, "attn_mask", options.attn_mask};
  const Arg* mask_read = options.attn_mask.empty() ? nullptr : &mask_arg;
  if (out) {
    const Arg out_arg{name, "out", *out};
    core::check_view(out_arg, 4, 4);
    core::check_same_dtype(out_arg, q_arg);
    core::check_dim(out_arg, 0, q_arg, 0);
    core::check_dim(out_arg, seq_dim, q_arg, seq_dim);
    core::check_dim(out_arg, head_dim, q_arg, head_dim);
    core::check_dim(out_arg, 3, v_arg, 3);
    check_written(out_arg, {&q_arg, &k_arg, &v_arg, mask_read});
    p.out = out->data;
    p.out_strides = strides_of(*out);
  }
  const TensorView& lse = options.lse;
  if (!lse.empty() || lse.rank != 0) {
    const Arg lse_arg{name, "lse", lse};
    core::check_view(lse_arg, 3, 3);
    core::check_dtype(lse_arg, {DType::f32});
    if (lse.shape[0] != p.batch || lse.shape[1] != p.heads || lse.shape[2] != p.q_len) {
      core::fail(name, "lse " + core::shape_string(lse) + " must be [B, N, Sq] = [" +
                           std::to_string(p.batch) + ", " + std::to_string(p.heads) + ", " +
                           std::to_string(p.q_len) + "]");
    }
    const Arg out_arg{name, "out", out ? *out : lse};  // read only when out is given
    check_written(lse_arg, {&q_arg, &k_arg, &v_arg, mask_read, out ? &out_arg : nullptr});
    p.lse = numel(lse) == 0 ? nullptr : static_cast<float*>(lse.data);
    p.lse_strides = Strides{lse.strides[0], lse.strides[2], lse.strides[1]};
  }
  call.requested = checked_backend(name, options.backend);
  if (!schedule::valid_chunk(options.int8_chunk)) {
    core::fail(name,
               "options.int8_chunk (" + std::to_string(options.int8_chunk) + ") must be 1, 2 or 4");
  }
  call.int8_chunk = options.int8_chunk;
  check_workspace(name, p, core::CheckedSize(p.batch) * p.kv_len,
                  core::CheckedSize(p.batch) * p.q_len);
  call.layout = options.head_first ? "bnsd" : "bsnd";
  call.key = describe(call);
  return call;
}

Call validate_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                     std::span<const std::int32_t> cu_q, std::span<const std::int32_t> cu_k,
                     const TensorView& out, const VarlenOptions& options) {
  constexpr const char* name = "attention_forward_varlen";
  const Arg q_arg{name, "q", q}, k_arg{name, "k", k}, v_arg{name, "v", v},
      out_arg{name, "out", out};
  core::check_view(q_arg, 3, 3);
  core::check_dtype(q_arg, {DType::f32, DType::bf16, DType::f16});
  for (const Arg* arg : {&k_arg, &v_arg, &out_arg}) {
    core::check_view(*arg, 3, 3);
    core::check_same_dtype(*arg, q_arg);
  }
  core::check_dim(k_arg, 2, q_arg, 2);
  core::check_dim(v_arg, 0, k_arg, 0);
  core::check_dim(v_arg, 1, k_arg, 1);
  core::check_dim(out_arg, 0, q_arg, 0);
  core::check_dim(out_arg, 1, q_arg, 1);
  core::check_dim(out_arg, 2, v_arg, 2);
  check_head_dim(q_arg, 2);
  check_head_dim(v_arg, 2);
  check_heads(q_arg, 1, k_arg, 1);
  if (cu_q.size() != cu_k.size()) {
    core::fail(name, "cu_seqlens_q has " + std::to_string(cu_q.size()) +
                         " entries but cu_seqlens_k has " + std::to_string(cu_k.size()));
  }
  check_cu_seqlens(name, "cu_seqlens_q", cu_q, q.shape[0], "q");
  check_cu_seqlens(name, "cu_seqlens_k", cu_k, k.shape[0], "k");

  Call call;
  call.scale = checked_scale(name, options.scale, q.shape[2]);
  FlashProblem& p = call.problem;
  p = problem_of(q, k, v, 1, call.scale, options.causal);
  p.batch = static_cast<std::int64_t>(cu_q.size()) - 1;
  p.cu_q = cu_q.data();
  p.cu_k = cu_k.data();
  p.out = out.data;
  auto strides_of = [](const TensorView& t) { return Strides{0, t.strides[0], t.strides[1]}; };
  p.q_strides = strides_of(q);
  p.k_strides = strides_of(k);
  p.v_strides = strides_of(v);
  p.out_strides = strides_of(out);
  check_written(out_arg, {&q_arg, &k_arg, &v_arg});
  const TensorView& lse = options.lse;
  if (!lse.empty() || lse.rank != 0) {
    const Arg lse_arg{name, "lse", lse};
    core::check_view(lse_arg, 2, 2);
    core::check_dtype(lse_arg, {DType::f32});
    if (lse.shape[0] != p.heads || lse.shape[1] != q.shape[0]) {
      core::fail(name, "lse " + core::shape_string(lse) + " must be [N, Tq] = [" +
                           std::to_string(p.heads) + ", " + std::to_string(q.shape[0]) + "]");
    }
    check_written(lse_arg, {&q_arg, &k_arg, &v_arg, &out_arg});
    p.lse = numel(lse) == 0 ? nullptr : static_cast<float*>(lse.data);
    p.lse_strides = Strides{0, lse.strides[1], lse.strides[0]};
  }
  call.requested = checked_backend(name, options.backend);
  check_workspace(name, p, k.shape[0], q.shape[0]);
  call.layout = "varlen";
  call.key = describe(call);
  return call;
}

std::string describe(const Call& call) {
  const FlashProblem& p = call.problem;
  std::string text = call.layout == "varlen"
                         ? "varlen b" + std::to_string(p.batch) + " tq" +
                               std::to_string(p.cu_q[p.batch]) + " tk" +
                               std::to_string(p.cu_k[p.batch])
                         : "b" + std::to_string(p.batch) + " sq" + std::to_string(p.q_len) + " sk" +
                               std::to_string(p.kv_len);
  text += " n" + std::to_string(p.heads) + "/" + std::to_string(p.kv_heads) + " d" +
          std::to_string(p.dk) + "/" + std::to_string(p.dv) + " " + dtype_name(p.dtype);
  if (call.layout != "varlen") text += " " + call.layout + " mask:" + call.mask;
  return text + (p.causal ? " causal" : "") + (p.lse ? " lse" : "");
}

}  // namespace ditops::attention
