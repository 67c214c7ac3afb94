#pragma once
// RainFusion sparse attention for video diffusion transformers: per-head spatial / temporal /
// textural token masks, online head classification, and block-sparse attention whose cost
// follows the kept blocks.

#include <cstdint>
#include <ditops/attention.hpp>
#include <ditops/tensor.hpp>
#include <span>
#include <vector>

namespace ditops {

enum class HeadPattern : std::uint8_t { dense, spatial, temporal, textural };

/// "dense", "spatial", "temporal", "textural".
const char* pattern_name(HeadPattern pattern) noexcept;

/// One sequence's tokens: `text_tokens` text tokens and a video latent of frames x height x width
/// tokens in (t, h, w) order; S = text_tokens + frames * height * width.
struct VideoLayout {
  std::int64_t frames = 1, height = 1, width = 1;
  std::int64_t text_tokens = 0;
  bool text_first = true;  ///< [text, video] (true) or [video, text] (false)
};

struct RainFusionOptions {
  VideoLayout video;
  /// Spatial / temporal heads: the share of the video x video scores skipped, in [0, 1). Frame
  /// 0's rows and columns count as kept, so a spatial head keeps at least its own frame plus
  /// frame 0 (about 3 / frames of the scores) and a temporal head frame 0 (about 2 / frames): a
  /// larger sparsity stops there (rainfusion_density says what a pattern keeps).
  float sparsity = 0.64f;
  int textural_stride = 2;  ///< textural heads keep the keys on a stride-tau (h, w) lattice
  /// Classification: temporal if the sampled temporal-mask recall reaches it, else spatial if
  /// the spatial one does, else textural. In (0, 1].
  float recall_threshold = 0.95f;
  bool dense_first_frame = true;  ///< frame 0 attends, and is attended by, every token
};

/// Online head classification (ARM): one pattern per (batch, head), batch-major, from a sample of
/// the queries: m = max(16, S / 200) sparse video tokens (outside frame 0 when
/// dense_first_frame), at most all of them, equally spaced in (t, h, w) order (the middle of
/// each of m equal shares). Per head, the exact softmax of each sampled row over all S keys
/// (fp32 scores, fp64 sums) and the share of its mass on the keys the temporal and the spatial
/// mask keep for that row (the recall), averaged over the sample: temporal if the temporal
/// recall reaches rf.recall_threshold, else spatial if the spatial one does, else textural (so
/// non-finite q or k give textural). A layout without sparse video tokens (one frame with
/// dense_first_frame) gives spatial for every head. Cost about m / S of dense attention's
/// scores, no S x S buffer. q, k as in attention_forward (BSND, or BNSD with
/// options.head_first; GQA; f32, bf16, f16; options.scale applies); self-attention over one
/// layout (Sq = Sk = S, else an Error naming q or k and the layout). options.attn_mask and
/// options.causal are not supported (an Error); options.lse and options.backend are ignored.
/// Deterministic, whatever the thread count. Never returns HeadPattern::dense.
std::vector<HeadPattern> rainfusion_classify(const TensorView& q, const TensorView& k,
                                             const RainFusionOptions& rf,
                                             const AttentionOptions& options = {});

/// The token mask a pattern stands for, bool [S, S], true = attend. Text rows and columns are
/// always true, and so are frame 0's rows and columns when dense_first_frame. spatial: a query
/// attends every token of its own frame and the tokens within a distance r of it in (t, h, w)
/// order (neighbouring frames), r the smallest that keeps 1 - sparsity of the video x video
/// scores; temporal: a query at (t, h, w) attends (t', h, w) for every frame t' and the tokens
/// within a distance r of it in (h, w, t) order (spatial neighbours across frames), r likewise;
/// textural: every video query attends the keys with h and w multiples of textural_stride;
/// dense: all true.
void rainfusion_mask(HeadPattern pattern, const RainFusionOptions& rf, const TensorView& mask);

/// The share of the video x video scores `pattern` keeps under `rf` (1 for dense).
double rainfusion_density(HeadPattern pattern, const RainFusionOptions& rf);

/// Attention in which head (b, n) computes only the scores its pattern keeps, at a cost
/// proportional to them. patterns: B*N entries batch-major, or empty = rainfusion_classify first.
/// Result: attention_forward with rainfusion_mask(pattern) as the boolean mask of each head.
/// options.attn_mask and options.causal are not supported here (an Error); options.lse is.
/// Plans (token orders, windows) are cached per layout and options, so the same layer called
/// at every denoising step plans once.
void rainfusion_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                          std::span<const HeadPattern> patterns, const TensorView& out,
                          const RainFusionOptions& rf, const AttentionOptions& options = {});

/// General block-sparse attention: for head n, key block j of query block i is computed iff
/// block_mask[n][i][j] (bool [N|1, ceil(Sq / block_size), ceil(Sk / block_size)], or with a
/// leading batch dimension [B|1, N|1, ...]); block_size 64 or 128. Result: attention_forward
/// with that mask expanded to tokens (and options.attn_mask / causal on top); cost proportional
/// to the kept blocks.
void block_sparse_attention(const TensorView& q, const TensorView& k, const TensorView& v,
                            const TensorView& block_mask, int block_size, const TensorView& out,
                            const AttentionOptions& options = {});

/// RainFusion 2 adaptive block selection: q and k are mean-pooled over blocks of block_size
/// tokens (64 or 128; the last block is the mean of the tokens it has), blocks in native token
/// order. Blocks holding a text token or (dense_first_frame) a frame-0 token are forced: kept
/// whole, in both directions (their rows and columns all true). Every other query block keeps
/// max(F, K) key blocks, K = ceil((1 - rf.sparsity) x nb) (nb = ceil(S / block_size); a float
/// sparsity's rounding, relative 1e-6, does not raise K) and F the forced key blocks: the F
/// forced ones, then the K - F other key blocks of highest pooled score scale x q_pool . k_pool
/// (ties to the lower block index; NaN ranks lowest). Writes block_mask, bool [B, N, nb, nb],
/// for block_sparse_attention. q, k as in rainfusion_classify (Sq = Sk = S; attn_mask and
/// causal are an Error); block_mask must not overlap them.
void rainfusion_adaptive_blocks(const TensorView& q, const TensorView& k,
                                const RainFusionOptions& rf, int block_size,
                                const TensorView& block_mask, const AttentionOptions& options = {});

}  // namespace ditops
