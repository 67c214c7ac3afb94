#pragma once
// RainFusion token geometry: where text, frame 0 and each video token sit, and for each head
// pattern the token order, the always-attended key prefix ("sink") and each query's key window
// that the block-sparse kernel, rainfusion_mask, the density and the classifier all read. One
// plan per (layout, pattern): the mask a user sees is the mask the kernel computes.

#include <cstdint>
#include <ditops/sparse.hpp>
#include <memory>
#include <string>
#include <vector>

namespace ditops::sparse {

/// A validated VideoLayout plus the options that shape the masks.
struct Layout {
  std::int64_t frames = 1, height = 1, width = 1, text = 0;
  std::int64_t frame_size = 1;   ///< height * width
  std::int64_t video = 1;        ///< frames * frame_size
  std::int64_t tokens = 1;       ///< S = text + video (< 2^31)
  std::int64_t first_video = 0;  ///< token index of video (0, 0, 0)
  std::int64_t first_text = 0;   ///< token index of text token 0
  bool dense_first_frame = true;
  float sparsity = 0.f;
  int stride = 2;
  float recall_threshold = 0.95f;

  /// Index of the first frame whose tokens are sparse: 1 with dense_first_frame (frame 0 is
  /// attended by, and attends, everything), else 0. The sparse frames are [it, frames).
  std::int64_t first_sparse_frame() const noexcept { return dense_first_frame ? 1 : 0; }
  std::int64_t video_token(std::int64_t t, std::int64_t h, std::int64_t w) const noexcept {
    return first_video + (t * height + h) * width + w;
  }
};

/// Validates `rf` for `call` (extents >= 1, text >= 0, S < 2^31, sparsity in [0, 1), stride >=
/// 1, recall threshold in (0, 1]).
Layout checked_layout(const char* call, const RainFusionOptions& rf);

/// "rf.video: 37 text + 4 x 6 x 10 = 277 tokens", for messages.
std::string describe(const Layout& layout);

/// The RainFusion entries score plain bidirectional self-attention over one layout: q and k
/// (their sequence lengths given) must hold S tokens, and options.attn_mask and causal would
/// change which scores exist, so they are refused (options.lse and backend are left to the
/// caller). Throws ditops::Error naming `call` and the argument.
void check_self_attention(const char* call, std::int64_t q_len, std::int64_t kv_len,
                          const Layout& layout, const AttentionOptions& options);

/// How one pattern's heads see the tokens. Queries and keys use the same order: position p holds
/// token order[p]. Text and (dense_first_frame) frame-0 tokens come first: keys [0, sink_end)
/// are attended by every query, and queries [0, sink_end) attend every key. Query position p
/// attends the keys [0, sink_end) and [window[2p], window[2p + 1]); a window that starts at 0
/// covers the sink. The remaining (sparse) video tokens follow in the pattern's order, so each
/// window is one contiguous run:
///   spatial:  (t, h, w) order; own frame plus a distance-r band (neighbouring frames);
///   temporal: (h, w, t) order; own (h, w) column plus a distance-r band (neighbouring columns);
///   textural: lattice tokens (h, w multiples of the stride) first; every window is the lattice;
///   dense:    token order; every window is all keys.
struct PatternPlan {
  HeadPattern pattern = HeadPattern::dense;
  std::vector<std::int32_t> order;     ///< position -> token
  std::vector<std::int32_t> position;  ///< token -> position
  std::vector<std::int32_t> window;    ///< [begin, end) per query position
  std::int64_t sink_end = 0;
  std::int64_t radius = 0;  ///< spatial / temporal band half-width, in positions
  double density = 1.;      ///< kept share of the video x video scores

  bool attends(std::int64_t query_token, std::int64_t key_token) const noexcept {
    const std::int64_t q = position[query_token], k = position[key_token];
    return k < sink_end || (window[2 * q] <= k && k < window[2 * q + 1]);
  }
};

/// The plan of `pattern` on `layout`: spatial and temporal take the smallest band radius whose
/// density reaches 1 - sparsity (or radius 0 when the own frame / column alone exceeds it).
PatternPlan plan_pattern(HeadPattern pattern, const Layout& layout);

/// plan_pattern through a small cache keyed by layout and pattern (the same layer runs at every
/// denoising step). Thread-safe; plans are immutable.
std::shared_ptr<const PatternPlan> cached_plan(HeadPattern pattern, const Layout& layout);

/// Validates one pattern value (an enum cast from an integer would otherwise plan as dense).
HeadPattern checked_pattern(const char* call, HeadPattern pattern);

}  // namespace ditops::sparse
