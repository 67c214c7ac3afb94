#pragma once
// One diffusion-transformer block assembled from ditops' public API, in FLUX's two shapes:
// double-stream (MMDiT, FLUX's first 19 blocks: text and image tokens keep separate weights,
// each stream its own AdaLN modulation, fused QKV, q/k norms, out-projection and MLP, and
// attention runs jointly over the concatenated [text, image] sequence) and single-stream
// (FLUX's later blocks: one set of weights for every token). Both run AdaLN modulation, fused
// QKV, per-head q/k RMSNorm, 2-D RoPE, attention, a gated residual and a GELU MLP after it (in
// sequence, as in DiT and SD3 blocks; FLUX's single-stream blocks run the MLP beside attention
// from one fused input projection). The operators are written once: a stream is a set of
// weights and the tokens of each sequence it covers. Everything heavy is a ditops call;
// element-wise glue is plain loops.
//
// Weights are synthetic (drawn from a seed) or a model file's: a DitBlock loads its layers
// from a ditops::QuantModel by the names of diffusers' FLUX transformer (flux_layer_names), so
// a quantized FLUX checkpoint's block loads as it is. The block stays FLUX-like, not
// FLUX-exact: its norms are its own (RMSNorm under the AdaLN modulation where FLUX has a
// LayerNorm without affine weights; FLUX's q/k RMSNorms are the same), its RoPE is 2-D over
// the latent's rows and columns (FLUX rotates three axes, 16/56/56 of 128 dimensions, with text
// positions of their own), and its single-stream block runs the MLP after attention.

#include <cstdint>
#include <ditops/attention.hpp>
#include <ditops/linear.hpp>
#include <ditops/quant_model.hpp>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dit {

enum class AttentionKind { flash, int8, rainfusion };
enum class LinearKind { w8a8, fp32 };
enum class StreamKind { single_stream, double_stream };

/// "flash", "int8", "rainfusion" / "w8a8", "fp32" / "single", "double" (the CLI's spelling).
const char* attention_kind_name(AttentionKind kind) noexcept;
const char* linear_kind_name(LinearKind kind) noexcept;
const char* stream_kind_name(StreamKind kind) noexcept;

struct DitBlockConfig {
  std::int64_t hidden = 3072;
  std::int64_t heads = 24;  ///< hidden = heads * head_dim
  std::int64_t head_dim = 128;
  std::int64_t mlp_ratio = 4;
  std::int64_t image_tokens = 4608;
  /// Image tokens per latent row, for the 2-D RoPE and RainFusion's layout; 0: the largest
  /// divisor of image_tokens not above its square root (64 x 72 for 4608).
  std::int64_t image_width = 0;
  /// RainFusion only: the image tokens split into this many frames (a video latent); the
  /// sparse patterns need several frames to skip anything.
  std::int64_t frames = 1;
  std::int64_t text_tokens = 512;  ///< the padded text length every sequence has
  AttentionKind attention = AttentionKind::flash;
  LinearKind linear = LinearKind::w8a8;
  /// double_stream: text and image tokens through separate weights (needs text_tokens > 0).
  StreamKind stream = StreamKind::double_stream;
  float eps = 1e-6f;
  std::uint32_t seed = 1;

  std::int64_t sequence() const noexcept { return text_tokens + image_tokens; }
  std::int64_t mlp_hidden() const noexcept { return hidden * mlp_ratio; }
  std::int64_t streams() const noexcept { return stream == StreamKind::double_stream ? 2 : 1; }
  /// image_width resolved (see above).
  std::int64_t width() const noexcept;
  /// Throws ditops::Error naming the first inconsistent field.
  void validate() const;
};

/// One linear layer's weights, kept so that a reference can recompute the block.
struct LinearWeights {
  std::int64_t out = 0, in = 0;
  std::vector<float> weight;          ///< f32 [out, in]; W8A8: weight_q * weight_scale
  std::vector<std::int8_t> weight_q;  ///< i8 [out, in], W8A8 only
  std::vector<float> weight_scale;    ///< f32 [out], W8A8 only (per output channel)
  std::vector<float> bias;            ///< f32 [out]
};

/// The weights one stream of tokens runs through.
struct StreamWeights {
  /// [6 * hidden, hidden] on silu(conditioning): shift, scale and gate of the attention half,
  /// then of the MLP half (AdaLN-Zero's six vectors).
  LinearWeights modulation;
  LinearWeights q, k, v, out, mlp_up, mlp_down;
  std::vector<float> q_norm, k_norm;  ///< [head_dim] per-head RMSNorm weights
};

struct DitBlockWeights {
  /// config.streams() of them, in the order of the tokens they cover: all tokens
  /// (single-stream), or text then image (double-stream).
  std::vector<StreamWeights> streams;
};

/// One stream's layers by their names in a checkpoint, relative to the block's prefix:
/// linear layers as QuantModel::linear takes them (the tensors are `<name>.weight` and
/// `<name>.bias`), the q/k norms as the weight tensors' own names.
struct StreamLayerNames {
  std::string modulation, q, k, v, q_norm, k_norm, out, mlp_up, mlp_down;
};

/// diffusers' FLUX names, in the order of DitBlockWeights::streams.
///   double-stream, text:  norm1_context.linear, attn.add_q_proj / add_k_proj / add_v_proj,
///                         attn.norm_added_q.weight / norm_added_k.weight, attn.to_add_out,
///                         ff_context.net.0.proj, ff_context.net.2
///   double-stream, image: norm1.linear, attn.to_q / to_k / to_v, attn.norm_q.weight /
///                         norm_k.weight, attn.to_out.0, ff.net.0.proj, ff.net.2
///   single-stream:        the image stream's names, but norm.linear for the modulation (as
///                         in FLUX's single blocks). FLUX's single blocks run the MLP beside
///                         attention (proj_mlp [mlp, hidden], and proj_out [hidden, hidden +
///                         mlp] over both results); this block runs it after attention with
///                         an out-projection and MLP of its own, so a FLUX single block's
///                         checkpoint does not fit it (its norm.linear is [3 hidden, hidden],
///                         and it has no attn.to_out.0).
std::vector<StreamLayerNames> flux_layer_names(StreamKind stream);
/// Where one FLUX block's layers sit in a whole-transformer checkpoint: "transformer_blocks.0."
/// (double-stream) or "single_transformer_blocks.0." (single-stream).
std::string default_layer_prefix(StreamKind stream);

/// Random weights drawn from config.seed (1/sqrt(in) scaled), stream after stream from one
/// generator (so the first stream is the single-stream block's of the same seed); for
/// LinearKind::w8a8 each layer is quantized per output channel (symmetric int8, scale
/// max|w| / 127).
DitBlockWeights make_synthetic_weights(const DitBlockConfig& config);

/// Writes `weights` (config.streams() of them) as an F32 safetensors file of a block's
/// checkpoint: every layer's `weight` [out, in] and `bias` [out], and the q/k norm weights
/// [head_dim], under prefix + flux_layer_names(config.stream) — the model ditops-quantize
/// takes. The W8A8 layers of make_synthetic_weights hold their dequantized values; write the
/// LinearKind::fp32 weights of the same seed (the same draw before quantization) so that
/// ditops-quantize --algo W8A8_DYNAMIC, whose per-channel quantization is the one above,
/// gives back exactly the integers and scales of the in-memory W8A8 block.
void write_weights(const std::string& path, const DitBlockConfig& config,
                   const DitBlockWeights& weights, const std::string& prefix);

/// Wall time per operator name, summed over calls, in the order names first appear.
class OpTimes {
 public:
  void add(const std::string& name, double seconds);
  void merge(const OpTimes& other);
  const std::vector<std::pair<std::string, double>>& entries() const noexcept { return entries_; }
  double total() const noexcept;

 private:
  std::vector<std::pair<std::string, double>> entries_;
};

/// The activations of one forward call, kept between calls so that a block allocates and
/// first-touches them once (at FLUX's shape about 1.3 GB for a batch of two, most of it the
/// MLP's 4 x hidden columns). One per thread that calls forward() concurrently.
struct DitWorkspace {
  std::vector<float> activated, modulation, normed, qkv, attended, projected, up;
};

class DitBlock {
 public:
  /// Packs the weights (each QuantLinear packs once; a copy of the block shares them).
  /// Throws ditops::Error naming the layer (by its flux_layer_names name) whose shape does not
  /// fit the config.
  DitBlock(const DitBlockConfig& config, const DitBlockWeights& weights);
  /// The layers of `model` under `prefix` + flux_layer_names(config.stream), each in the
  /// algorithm the model's description gives it (config.linear is not used); q, k and v fused
  /// into one layer as QuantModel::fused_qkv does. Throws ditops::Error naming the layer (or
  /// norm tensor) that is missing or whose shape does not fit the config.
  DitBlock(const DitBlockConfig& config, const ditops::QuantModel& model,
           const std::string& prefix);

  /// One block over `batch = text_lengths.size()` sequences of config.sequence() tokens, laid
  /// out [text padding, text, image] (text left-padded to text_tokens, so the valid tokens of
  /// every sequence are one contiguous suffix). x: [batch, S, hidden] f32, the residual stream,
  /// updated in place. conditioning: [batch, hidden] f32 (timestep + pooled text embedding).
  /// Double-stream: the first text_tokens rows of every sequence (padding included) run
  /// through the text weights, the rest through the image weights; attention is joint.
  /// Padding tokens are never attended to; their own rows come out finite but meaningless.
  /// Safe to call from several threads at once, each with its own workspace (null: the call
  /// allocates its activations).
  void forward(std::span<float> x, std::span<const float> conditioning,
               std::span<const std::int64_t> text_lengths, OpTimes* times = nullptr,
               DitWorkspace* workspace = nullptr) const;

  const DitBlockConfig& config() const noexcept { return config_; }
  /// RoPE tables, f32 [S, head_dim] (rotated_interleaved layout), for a reference.
  const std::vector<float>& rope_cos() const noexcept { return rope_cos_; }
  const std::vector<float>& rope_sin() const noexcept { return rope_sin_; }

 private:
  /// One stream's packed layers and the tokens of every sequence it covers.
  struct StreamLayers {
    ditops::QuantLinear modulation, qkv, out, mlp_up, mlp_down;
    std::vector<float> q_norm, k_norm;
    std::int64_t first_token = 0, tokens = 0;
  };

  /// Where the layers come from: stream `s`'s layer or norm of the role `StreamWeights::*`,
  /// named `name` (with its prefix) in a checkpoint.
  using LinearSource = std::function<ditops::QuantLinear(
      std::size_t s, LinearWeights StreamWeights::*role, const std::string& name)>;
  using NormSource = std::function<std::vector<float>(
      std::size_t s, std::vector<float> StreamWeights::*role, const std::string& name)>;
  /// Builds every stream from the sources, each layer's shape checked against the config:
  /// the one path of weights in memory and weights in a file.
  void build_streams(const std::string& prefix, const LinearSource& linear, const NormSource& norm);

  DitBlockConfig config_;
  std::vector<StreamLayers> streams_;
  std::vector<float> rope_cos_, rope_sin_;
};

/// The inputs of one CFG call, N(0, 1) values from `seed`: x [2, S, hidden] (the conditional
/// sequence first) and conditioning [2, hidden]; the conditional prompt uses every text token,
/// the unconditional one `unconditional_text` of them (so the batch needs its padding mask).
struct CfgInput {
  std::vector<float> x, conditioning;
  std::vector<std::int64_t> text_lengths;
};
CfgInput random_cfg_input(const DitBlockConfig& config, std::uint32_t seed,
                          std::int64_t unconditional_text);

enum class CfgMode { fused, two_pass };

/// Classifier-free guidance around the block: the conditional and unconditional sequences
/// (x: [2, S, hidden], cond first) through `blocks` blocks, as one batch of two (fused: every
/// weight read once per block) or as two batch-1 passes, then guided = uncond + scale ·
/// (cond - uncond) (ditops::cfg_combine), [S, hidden]. x is updated in place.
void run_cfg(const DitBlock& block, int blocks, CfgMode mode, float guidance_scale,
             std::span<float> x, std::span<const float> conditioning,
             std::span<const std::int64_t> text_lengths, std::span<float> guided,
             OpTimes* times = nullptr, DitWorkspace* workspace = nullptr);

}  // namespace dit
