#pragma once
// What every attention-like entry shares (dense, varlen, block-sparse, RainFusion): one
// validated call (the kernel problem, the scale, the tuner key), built once by validate_dense or
// validate_varlen (validate.cpp) and read, never written, by every later stage.

#include <ditops/attention.hpp>
#include <span>
#include <string>

#include "ops/attention/attention_kernel.hpp"

namespace ditops::attention {

/// A validated call: the kernel problem plus what the tuner key and the reference need.
struct Call {
  FlashProblem problem;
  float scale = 1.f;
  std::string layout;         ///< "bsnd", "bnsd" or "varlen"
  std::string mask = "none";  ///< the mask's dtype and shape, e.g. "bool[1, 1, 300, 400]"
  std::string key;            ///< describe(*this): the tuner key (without the thread count)
  AttentionBackend requested = AttentionBackend::automatic;
  int int8_chunk = 2;  ///< the int8 backend's schedule chunk (1, 2 or 4)
};

/// The call in one line: shape, heads, head dims, dtype, layout, mask, causal, LSE (e.g.
/// "b1 sq4608 sk4608 n24/24 d128/128 f32 bsnd mask:none causal"; varlen "varlen b3 tq.. tk.. ..").
/// The tuner's key; errors and reports that name a problem use it too.
std::string describe(const Call& call);

/// Validates the tensors of a dense call (q, k, v, out when given, options.attn_mask and lse)
/// and describes it; every check throws ditops::Error naming `name` and the argument.
Call validate_dense(const char* name, const TensorView& q, const TensorView& k, const TensorView& v,
                    const TensorView* out, const AttentionOptions& options);

/// Validates the tensors of a varlen call (q, k, v, out, cu_seqlens_q / _k and options.lse) and
/// describes it; every check throws ditops::Error naming attention_forward_varlen.
Call validate_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                     std::span<const std::int32_t> cu_q, std::span<const std::int32_t> cu_k,
                     const TensorView& out, const VarlenOptions& options);

}  // namespace ditops::attention
