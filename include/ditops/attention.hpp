#pragma once
// Scaled dot-product attention: dense BSND/BNSD and packed varlen (TND),
// with auto-tuned backends.

#include <cstdint>
#include <ditops/tensor.hpp>
#include <optional>
#include <span>
#include <string>

namespace ditops {

enum class AttentionBackend { automatic, reference, flash, flash_bf16, int8, sparse };

struct AttentionChoice;

struct AttentionOptions {
  std::optional<float> scale;  ///< default 1/sqrt(Dk); finite, > 0 and <= 65536
  bool causal = false;         ///< bottom-right aligned when Sq != Sk
  bool head_first = false;     ///< false: q,k,v,out are BSND; true: BNSD
  TensorView attn_mask{};      ///< boolean (true = attend) or f32 additive; broadcastable as
                               ///< [B|1, N|1, Sq|1, Sk]; rank 2 means [Sq, Sk]. Additive
                               ///< elements above 2^126 (+inf) are an Error; below -2^126
                               ///< (-FLT_MAX) they exclude the key like -inf.
  TensorView lse{};            ///< optional output, f32 [B, N, Sq], natural-log log-sum-exp
  AttentionBackend backend = AttentionBackend::automatic;
  int int8_chunk = 2;  ///< int8 backend only: 1, 2 or 4
  /// Optional output: when set, a call that succeeds stores what ran there (the backend, its
  /// configuration, whether the tuning cache chose it, and why a requested backend was refused):
  /// a refused or automatic call runs the tuner's choice, whose numerics may differ.
  AttentionChoice* ran = nullptr;
};

/// q: [B,Sq,N,Dk]; k: [B,Sk,Nkv,Dk]; v: [B,Sk,Nkv,Dv]; out: [B,Sq,N,Dv]; N % Nkv == 0.
/// f32, bf16 or f16 (q, k, v, out share one dtype). Rows with no attended key give 0
/// (lse = -inf).
void attention_forward(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const AttentionOptions& options = {});

struct VarlenOptions {
  std::optional<float> scale;
  bool causal = false;  ///< bottom-right aligned per sequence
  TensorView lse{};     ///< optional output, f32 [N, Tq]
  AttentionBackend backend = AttentionBackend::automatic;
  AttentionChoice* ran = nullptr;  ///< optional output: what ran (as AttentionOptions::ran)
};

/// q: [Tq,N,Dk]; k: [Tk,Nkv,Dk]; v: [Tk,Nkv,Dv]; out: [Tq,N,Dv];
/// cu_seqlens_*: batch+1 cumulative offsets, first 0, non-decreasing, last = Tq (resp. Tk).
void attention_forward_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                              std::span<const std::int32_t> cu_seqlens_q,
                              std::span<const std::int32_t> cu_seqlens_k, const TensorView& out,
                              const VarlenOptions& options = {});

/// The attention over the union of two disjoint key sets, from the attention over each:
/// out = (e^lse_a · out_a + e^lse_b · out_b) / (e^lse_a + e^lse_b) and
/// lse = log(e^lse_a + e^lse_b), per row, computed in fp32 around the larger lse (what ring
/// attention and split-KV decoding merge; vLLM and FlashInfer call it merge_state).
/// out_a, out_b, out: [B, S, N, D] (BSND; a BNSD tensor passes as its permuted view), each f32,
/// bf16 or f16; lse_a, lse_b, lse: f32 [B, N, S], natural-log. A row whose lse is -inf on one
/// side (no key attended there) takes the other side exactly; -inf on both gives 0 and -inf. A
/// NaN or +inf lse gives a NaN row. out may be out_a or out_b itself and lse may be lse_a or
/// lse_b (in place); no other overlap.
void merge_attention_states(const TensorView& out_a, const TensorView& lse_a,
                            const TensorView& out_b, const TensorView& lse_b, const TensorView& out,
                            const TensorView& lse);

struct AttentionChoice {
  AttentionBackend backend;
  std::string detail;  ///< e.g. internal layout and tile sizes
  bool from_cache;     ///< true when an earlier tuning result was reused
};

/// What attention_forward would run for these arguments (tunes on a cache miss; options.ran is
/// not written).
AttentionChoice select_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                                 const AttentionOptions& options = {});

/// Forgets every tuning choice this process holds, so that each key is tuned again (after the
/// machine's load changed, say); the DITOPS_TUNE_CACHE file is left as it is and read again.
void forget_attention_tuning();

/// "reference", "flash", ... (the names DITOPS_ATTN_BACKEND accepts).
const char* backend_name(AttentionBackend backend) noexcept;

}  // namespace ditops
