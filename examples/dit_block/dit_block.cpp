#include "dit_block.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ditops/guidance.hpp>
#include <ditops/norm.hpp>
#include <ditops/rope.hpp>
#include <ditops/runtime.hpp>
#include <ditops/sparse.hpp>
#include <memory>
#include <random>

namespace dit {
namespace {

using ditops::TensorView;

/// Runs `work` and, when `times` is given, adds its wall time under `name`.
template <class Work>
void timed(OpTimes* times, const char* name, const Work& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  if (times) {
    times->add(name,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
}

/// Uniform on [-a, a] with a = sqrt(3 / in): the variance of the usual 1/sqrt(in) init, drawn
/// several times faster than a normal (the FLUX shape has 170M weights per stream to draw at
/// start).
LinearWeights random_linear(std::int64_t out, std::int64_t in, std::mt19937& rng, bool quantize) {
  LinearWeights layer;
  layer.out = out;
  layer.in = in;
  const float bound = std::sqrt(3.f / static_cast<float>(in));
  std::uniform_real_distribution<float> weight(-bound, bound), bias(-0.02f, 0.02f);
  layer.weight.resize(static_cast<std::size_t>(out * in));
  for (float& w : layer.weight) w = weight(rng);
  layer.bias.resize(static_cast<std::size_t>(out));
  for (float& b : layer.bias) b = bias(rng);
  if (!quantize) return layer;
  // Symmetric per-output-channel int8, as msmodelslim quantizes W8A8 weights; `weight` keeps
  // the dequantized values, the exact fp32 layer the integers stand for.
  layer.weight_q.resize(layer.weight.size());
  layer.weight_scale.resize(static_cast<std::size_t>(out));
  for (std::int64_t n = 0; n < out; ++n) {
    float* row = &layer.weight[static_cast<std::size_t>(n * in)];
    float top = 0.f;
    for (std::int64_t i = 0; i < in; ++i) top = std::max(top, std::fabs(row[i]));
    const float scale = top > 0.f ? top / 127.f : 1.f;
    layer.weight_scale[static_cast<std::size_t>(n)] = scale;
    for (std::int64_t i = 0; i < in; ++i) {
      const auto q = static_cast<std::int8_t>(std::nearbyint(row[i] / scale));
      layer.weight_q[static_cast<std::size_t>(n * in + i)] = q;
      row[i] = static_cast<float>(q) * scale;
    }
  }
  return layer;
}

ditops::QuantLinear make_linear(const LinearWeights& layer, LinearKind kind) {
  const TensorView bias = ditops::view(layer.bias.data(), {layer.out});
  if (kind == LinearKind::fp32) {
    return ditops::QuantLinear::float_linear(
        ditops::view(layer.weight.data(), {layer.out, layer.in}), bias);
  }
  ditops::W8A8Tensors tensors;
  tensors.weight = ditops::view(layer.weight_q.data(), {layer.out, layer.in});
  tensors.weight_scale = ditops::view(layer.weight_scale.data(), {layer.out});
  tensors.bias = bias;
  return ditops::QuantLinear::w8a8(ditops::QuantAlgo::w8a8_dynamic, tensors);
}

/// FLUX-style 2-D RoPE in the interleaved layout: the first half of the rotation pairs turn
/// with the token's latent row, the second half with its column; text tokens sit at (0, 0),
/// which leaves them unrotated.
void rope_tables(const DitBlockConfig& config, std::vector<float>& cos, std::vector<float>& sin) {
  const std::int64_t dim = config.head_dim, pairs = dim / 2, row_pairs = pairs / 2;
  const std::int64_t width = config.width();
  cos.assign(static_cast<std::size_t>(config.sequence() * dim), 1.f);
  sin.assign(static_cast<std::size_t>(config.sequence() * dim), 0.f);
  for (std::int64_t token = 0; token < config.image_tokens; ++token) {
    const double row = static_cast<double>(token / width);
    const double column = static_cast<double>(token % width);
    const std::int64_t at = (config.text_tokens + token) * dim;
    for (std::int64_t p = 0; p < pairs; ++p) {
      const bool by_row = p < row_pairs;
      const std::int64_t index = by_row ? p : p - row_pairs;
      const std::int64_t count = by_row ? row_pairs : pairs - row_pairs;
      const double angle =
          (by_row ? row : column) *
          std::pow(10000.0, -static_cast<double>(index) / static_cast<double>(count));
      for (std::int64_t half = 0; half < 2; ++half) {
        cos[static_cast<std::size_t>(at + 2 * p + half)] = static_cast<float>(std::cos(angle));
        sin[static_cast<std::size_t>(at + 2 * p + half)] = static_cast<float>(std::sin(angle));
      }
    }
  }
}

/// The widths a layer's dimension can have: hidden, AdaLN's six vectors, or the MLP's.
enum class Width { hidden, modulation, mlp };

std::int64_t width_of(const DitBlockConfig& config, Width width) {
  switch (width) {
    case Width::hidden:
      return config.hidden;
    case Width::modulation:
      return 6 * config.hidden;
    case Width::mlp:
      return config.mlp_hidden();
  }
  return 0;
}

/// A linear layer's place in a stream: its weights in memory, its name in a checkpoint, and
/// its [out, in]. Loading and writing a checkpoint both go through these, so the two agree.
struct LinearRole {
  LinearWeights StreamWeights::*weights;
  std::string StreamLayerNames::*name;
  Width out, in;
};
constexpr LinearRole kModulation{&StreamWeights::modulation, &StreamLayerNames::modulation,
                                 Width::modulation, Width::hidden};
constexpr LinearRole kQ{&StreamWeights::q, &StreamLayerNames::q, Width::hidden, Width::hidden};
constexpr LinearRole kK{&StreamWeights::k, &StreamLayerNames::k, Width::hidden, Width::hidden};
constexpr LinearRole kV{&StreamWeights::v, &StreamLayerNames::v, Width::hidden, Width::hidden};
constexpr LinearRole kOut{&StreamWeights::out, &StreamLayerNames::out, Width::hidden,
                          Width::hidden};
constexpr LinearRole kMlpUp{&StreamWeights::mlp_up, &StreamLayerNames::mlp_up, Width::mlp,
                            Width::hidden};
constexpr LinearRole kMlpDown{&StreamWeights::mlp_down, &StreamLayerNames::mlp_down, Width::hidden,
                              Width::mlp};
constexpr LinearRole kLinearRoles[] = {kModulation, kQ, kK, kV, kOut, kMlpUp, kMlpDown};

/// A q/k norm's weights in memory and its tensor's name in a checkpoint ([head_dim]).
struct NormRole {
  std::vector<float> StreamWeights::*weights;
  std::string StreamLayerNames::*name;
};
constexpr NormRole kQNorm{&StreamWeights::q_norm, &StreamLayerNames::q_norm};
constexpr NormRole kKNorm{&StreamWeights::k_norm, &StreamLayerNames::k_norm};
constexpr NormRole kNormRoles[] = {kQNorm, kKNorm};

}  // namespace

std::vector<StreamLayerNames> flux_layer_names(StreamKind stream) {
  const StreamLayerNames image{.modulation = "norm1.linear",
                               .q = "attn.to_q",
                               .k = "attn.to_k",
                               .v = "attn.to_v",
                               .q_norm = "attn.norm_q.weight",
                               .k_norm = "attn.norm_k.weight",
                               .out = "attn.to_out.0",
                               .mlp_up = "ff.net.0.proj",
                               .mlp_down = "ff.net.2"};
  if (stream == StreamKind::single_stream) {
    StreamLayerNames single = image;
    single.modulation = "norm.linear";
    return {single};
  }
  const StreamLayerNames text{.modulation = "norm1_context.linear",
                              .q = "attn.add_q_proj",
                              .k = "attn.add_k_proj",
                              .v = "attn.add_v_proj",
                              .q_norm = "attn.norm_added_q.weight",
                              .k_norm = "attn.norm_added_k.weight",
                              .out = "attn.to_add_out",
                              .mlp_up = "ff_context.net.0.proj",
                              .mlp_down = "ff_context.net.2"};
  return {text, image};
}

std::string default_layer_prefix(StreamKind stream) {
  return stream == StreamKind::double_stream ? "transformer_blocks.0."
                                             : "single_transformer_blocks.0.";
}

const char* attention_kind_name(AttentionKind kind) noexcept {
  switch (kind) {
    case AttentionKind::flash:
      return "flash";
    case AttentionKind::int8:
      return "int8";
    case AttentionKind::rainfusion:
      return "rainfusion";
  }
  return "?";
}

const char* linear_kind_name(LinearKind kind) noexcept {
  return kind == LinearKind::w8a8 ? "w8a8" : "fp32";
}

const char* stream_kind_name(StreamKind kind) noexcept {
  return kind == StreamKind::double_stream ? "double" : "single";
}

std::int64_t DitBlockConfig::width() const noexcept {
  if (image_width > 0) return image_width;
  const std::int64_t per_frame = frames > 0 ? image_tokens / frames : image_tokens;
  std::int64_t width = 1;
  for (std::int64_t w = 1; w * w <= per_frame; ++w) {
    if (per_frame % w == 0) width = w;
  }
  return width;
}

void DitBlockConfig::validate() const {
  auto require = [](bool ok, const std::string& what) {
    if (!ok) throw ditops::Error("DitBlockConfig: " + what);
  };
  require(hidden > 0 && heads > 0 && head_dim > 0, "hidden, heads and head_dim must be > 0");
  require(hidden == heads * head_dim, "hidden (" + std::to_string(hidden) + ") != heads (" +
                                          std::to_string(heads) + ") * head_dim (" +
                                          std::to_string(head_dim) + ")");
  require(head_dim % 2 == 0, "head_dim must be even (RoPE rotates pairs)");
  require(mlp_ratio > 0, "mlp_ratio must be > 0");
  require(image_tokens > 0 && text_tokens >= 0, "image_tokens must be > 0, text_tokens >= 0");
  require(stream == StreamKind::single_stream || text_tokens > 0,
          "a double-stream block needs text tokens (text_tokens > 0)");
  require(frames > 0 && image_tokens % frames == 0, "frames must divide image_tokens");
  require((image_tokens / frames) % width() == 0,
          "image_width must divide the image tokens of a frame");
  require(eps > 0.f, "eps must be > 0");
}

void OpTimes::add(const std::string& name, double seconds) {
  for (auto& [entry, total] : entries_) {
    if (entry == name) {
      total += seconds;
      return;
    }
  }
  entries_.emplace_back(name, seconds);
}

void OpTimes::merge(const OpTimes& other) {
  for (const auto& [name, seconds] : other.entries_) add(name, seconds);
}

double OpTimes::total() const noexcept {
  double sum = 0;
  for (const auto& entry : entries_) sum += entry.second;
  return sum;
}

DitBlockWeights make_synthetic_weights(const DitBlockConfig& config) {
  config.validate();
  std::mt19937 rng(config.seed);
  const bool quantize = config.linear == LinearKind::w8a8;
  const std::int64_t hidden = config.hidden, mlp = config.mlp_hidden();
  DitBlockWeights weights;
  weights.streams.resize(static_cast<std::size_t>(config.streams()));
  for (StreamWeights& stream : weights.streams) {
    stream.modulation = random_linear(6 * hidden, hidden, rng, quantize);
    stream.q = random_linear(hidden, hidden, rng, quantize);
    stream.k = random_linear(hidden, hidden, rng, quantize);
    stream.v = random_linear(hidden, hidden, rng, quantize);
    stream.out = random_linear(hidden, hidden, rng, quantize);
    stream.mlp_up = random_linear(mlp, hidden, rng, quantize);
    stream.mlp_down = random_linear(hidden, mlp, rng, quantize);
    std::uniform_real_distribution<float> norm_weight(0.5f, 1.5f);
    for (auto* norm : {&stream.q_norm, &stream.k_norm}) {
      norm->resize(static_cast<std::size_t>(config.head_dim));
      for (float& w : *norm) w = norm_weight(rng);
    }
  }
  return weights;
}

void write_weights(const std::string& path, const DitBlockConfig& config,
                   const DitBlockWeights& weights, const std::string& prefix) {
  config.validate();
  const std::vector<StreamLayerNames> names = flux_layer_names(config.stream);
  if (weights.streams.size() != names.size()) {
    throw ditops::Error("write_weights: a " + std::string(stream_kind_name(config.stream)) +
                        "-stream block has " + std::to_string(names.size()) +
                        " streams of weights, not " + std::to_string(weights.streams.size()));
  }
  std::vector<ditops::NamedTensor> tensors;
  for (std::size_t s = 0; s < names.size(); ++s) {
    const StreamWeights& stream = weights.streams[s];
    for (const LinearRole& role : kLinearRoles) {
      const LinearWeights& layer = stream.*role.weights;
      const std::string name = prefix + names[s].*role.name;
      // The views below read out * in and out values: the vectors must hold them.
      if (layer.weight.size() != static_cast<std::size_t>(layer.out * layer.in) ||
          layer.bias.size() != static_cast<std::size_t>(layer.out)) {
        throw ditops::Error("write_weights: layer \"" + name + "\" holds " +
                            std::to_string(layer.weight.size()) + " weights and " +
                            std::to_string(layer.bias.size()) + " biases for [out, in] = [" +
                            std::to_string(layer.out) + ", " + std::to_string(layer.in) + "]");
      }
      tensors.push_back(
          {name + ".weight", ditops::view(layer.weight.data(), {layer.out, layer.in})});
      tensors.push_back({name + ".bias", ditops::view(layer.bias.data(), {layer.out})});
    }
    for (const NormRole& role : kNormRoles) {
      const std::vector<float>& norm = stream.*role.weights;
      tensors.push_back({prefix + names[s].*role.name,
                         ditops::view(norm.data(), {static_cast<std::int64_t>(norm.size())})});
    }
  }
  ditops::write_safetensors(path, tensors);
}

DitBlock::DitBlock(const DitBlockConfig& config, const DitBlockWeights& weights)
    : config_((config.validate(), config)) {
  if (weights.streams.size() != static_cast<std::size_t>(config.streams())) {
    throw ditops::Error("DitBlock: a " + std::string(stream_kind_name(config.stream)) +
                        "-stream block needs " + std::to_string(config.streams()) +
                        " streams of weights, not " + std::to_string(weights.streams.size()));
  }
  // In memory the layers have no prefix: errors name them by their checkpoint names alone.
  build_streams(
      "",
      [&](std::size_t s, LinearWeights StreamWeights::*role, const std::string&) {
        return make_linear(weights.streams[s].*role, config.linear);
      },
      [&](std::size_t s, std::vector<float> StreamWeights::*role, const std::string&) {
        return weights.streams[s].*role;
      });
}

DitBlock::DitBlock(const DitBlockConfig& config, const ditops::QuantModel& model,
                   const std::string& prefix)
    : config_((config.validate(), config)) {
  build_streams(
      prefix,
      [&](std::size_t, LinearWeights StreamWeights::*, const std::string& name) {
        return model.linear(name);
      },
      [&](std::size_t, std::vector<float> StreamWeights::*, const std::string& name) {
        return model.float_tensor(name);
      });
}

void DitBlock::build_streams(const std::string& prefix, const LinearSource& linear,
                             const NormSource& norm) {
  const DitBlockConfig& c = config_;
  // The tokens of every sequence each stream covers: all of them, or the text then the image.
  const std::vector<std::int64_t> stream_tokens =
      c.stream == StreamKind::double_stream
          ? std::vector<std::int64_t>{c.text_tokens, c.image_tokens}
          : std::vector<std::int64_t>{c.sequence()};
  const std::vector<StreamLayerNames> names = flux_layer_names(c.stream);
  std::int64_t first_token = 0;
  for (std::size_t s = 0; s < stream_tokens.size(); ++s) {
    const auto layer = [&](const LinearRole& role) {
      const std::string name = prefix + names[s].*role.name;
      ditops::QuantLinear built = linear(s, role.weights, name);
      const std::int64_t out = width_of(c, role.out), in = width_of(c, role.in);
      if (built.out_features() != out || built.in_features() != in) {
        throw ditops::Error("DitBlock: layer \"" + name + "\" is [out, in] = [" +
                            std::to_string(built.out_features()) + ", " +
                            std::to_string(built.in_features()) + "], the config needs [" +
                            std::to_string(out) + ", " + std::to_string(in) + "]");
      }
      return built;
    };
    const auto norm_weights = [&](const NormRole& role) {
      const std::string name = prefix + names[s].*role.name;
      std::vector<float> weights = norm(s, role.weights, name);
      if (weights.size() != static_cast<std::size_t>(c.head_dim)) {
        throw ditops::Error(
            "DitBlock: norm \"" + name + "\" has " + std::to_string(weights.size()) +
            " weights, the config needs head_dim (" + std::to_string(c.head_dim) + ")");
      }
      return weights;
    };
    // q, k and v are built and checked one by one, so an error names the one that does not fit,
    // and then fused as QuantModel::fused_qkv fuses them.
    streams_.push_back(StreamLayers{
        .modulation = layer(kModulation),
        .qkv = ditops::QuantLinear::concat_outputs({layer(kQ), layer(kK), layer(kV)}),
        .out = layer(kOut),
        .mlp_up = layer(kMlpUp),
        .mlp_down = layer(kMlpDown),
        .q_norm = norm_weights(kQNorm),
        .k_norm = norm_weights(kKNorm),
        .first_token = first_token,
        .tokens = stream_tokens[s],
    });
    first_token += stream_tokens[s];
  }
  rope_tables(config_, rope_cos_, rope_sin_);
}

void DitBlock::forward(std::span<float> x, std::span<const float> conditioning,
                       std::span<const std::int64_t> text_lengths, OpTimes* times,
                       DitWorkspace* workspace) const {
  const DitBlockConfig& c = config_;
  const auto batch = static_cast<std::int64_t>(text_lengths.size());
  const std::int64_t seq = c.sequence(), hidden = c.hidden, rows = batch * seq;
  const std::int64_t heads = c.heads, dim = c.head_dim, mlp = c.mlp_hidden();
  if (batch < 1 || static_cast<std::int64_t>(x.size()) != rows * hidden ||
      static_cast<std::int64_t>(conditioning.size()) != batch * hidden) {
    throw ditops::Error("DitBlock::forward: x must hold [batch, " + std::to_string(seq) + ", " +
                        std::to_string(hidden) + "] and conditioning [batch, " +
                        std::to_string(hidden) + "], batch = text_lengths.size()");
  }
  for (std::int64_t length : text_lengths) {
    if (length < 0 || length > c.text_tokens) {
      throw ditops::Error("DitBlock::forward: a text length is outside [0, text_tokens]");
    }
  }
  const int threads = ditops::num_threads();

  // Activations in the caller's workspace (allocated and first touched once, not per block).
  DitWorkspace local;
  DitWorkspace& ws = workspace ? *workspace : local;
  const auto buffer = [](std::vector<float>& v, std::int64_t size) -> std::vector<float>& {
    v.resize(static_cast<std::size_t>(size));
    return v;
  };
  // The rows of `stream` in a [batch, S, columns] buffer: [batch, tokens, columns], strided
  // across sequences when the sequence holds two streams.
  const auto stream_rows = [&](std::vector<float>& values, std::int64_t columns,
                               const StreamLayers& stream) {
    return ditops::view(values.data() + stream.first_token * columns,
                        {batch, stream.tokens, columns}, {seq * columns, columns, 1});
  };
  // A linear layer with per-stream weights: each stream's layer on its own rows.
  const auto stream_linear = [&](const char* name, ditops::QuantLinear StreamLayers::*layer,
                                 std::vector<float>& in, std::vector<float>& out,
                                 ditops::Activation activation = ditops::Activation::none) {
    const std::int64_t in_columns = (streams_[0].*layer).in_features();
    const std::int64_t out_columns = (streams_[0].*layer).out_features();
    timed(times, name, [&] {
      for (const StreamLayers& stream : streams_) {
        (stream.*layer)
            .forward(stream_rows(in, in_columns, stream), stream_rows(out, out_columns, stream),
                     activation);
      }
    });
  };

  std::vector<float>& activated = ws.activated;
  activated.assign(conditioning.begin(), conditioning.end());
  const auto streams = static_cast<std::int64_t>(streams_.size());
  std::vector<float>& modulation = buffer(ws.modulation, streams * batch * 6 * hidden);
  // AdaLN: six [hidden] vectors per stream and sequence from silu(conditioning).
  timed(times, "modulation", [&] {
    for (float& v : activated) v = v / (1.f + std::exp(-v));
    float* stream_modulation = modulation.data();
    for (const StreamLayers& stream : streams_) {
      stream.modulation.forward(ditops::view(activated.data(), {batch, hidden}),
                                ditops::view(stream_modulation, {batch, 6 * hidden}));
      stream_modulation += batch * 6 * hidden;
    }
  });
  // Vector `which` (0..5: shift, scale, gate of attention, then of the MLP) for row r of x,
  // from its sequence's conditioning through the weights of its token's stream.
  const auto mod = [&](std::int64_t r, int which) {
    const bool image_stream = c.stream == StreamKind::double_stream && r % seq >= c.text_tokens;
    const std::int64_t stream = image_stream ? 1 : 0;
    return modulation.data() + ((stream * batch + r / seq) * 6 + which) * hidden;
  };
  // normed = normed * (1 + scale) + shift, per sequence: the AdaLN modulation around RMSNorm.
  std::vector<float>& normed = buffer(ws.normed, rows * hidden);
  const auto modulate = [&](int shift_index) {
    timed(times, "modulate", [&] {
#pragma omp parallel for num_threads(threads) schedule(static)
      for (std::int64_t r = 0; r < rows; ++r) {
        const float* shift = mod(r, shift_index);
        const float* scale = mod(r, shift_index + 1);
        float* row = normed.data() + r * hidden;
        for (std::int64_t i = 0; i < hidden; ++i) row[i] = row[i] * (1.f + scale[i]) + shift[i];
      }
    });
  };
  const TensorView x_view = ditops::view(x.data(), {rows, hidden});
  const TensorView normed_view = ditops::view(normed.data(), {rows, hidden});

  // ---- attention half ----
  timed(times, "rms_norm", [&] { ditops::rms_norm(x_view, {}, c.eps, normed_view); });
  modulate(0);
  std::vector<float>& qkv = buffer(ws.qkv, rows * 3 * hidden);
  stream_linear("qkv", &StreamLayers::qkv, normed, qkv);
  // q, k or v of tokens [first_token, first_token + tokens) of every sequence:
  // [batch, tokens, heads, head_dim] views into the fused output's columns.
  const auto part = [&](int index, std::int64_t first_token, std::int64_t tokens) {
    return ditops::view(qkv.data() + first_token * 3 * hidden + index * hidden,
                        {batch, tokens, heads, dim}, {seq * 3 * hidden, 3 * hidden, dim, 1});
  };
  timed(times, "qk_norm", [&] {
    for (const StreamLayers& stream : streams_) {
      const TensorView q = part(0, stream.first_token, stream.tokens);
      const TensorView k = part(1, stream.first_token, stream.tokens);
      ditops::rms_norm(q, ditops::view(stream.q_norm.data(), {dim}), c.eps, q);
      ditops::rms_norm(k, ditops::view(stream.k_norm.data(), {dim}), c.eps, k);
    }
  });
  // From here to the out-projection every token is alike: RoPE and attention over the whole
  // (joint) sequence.
  const TensorView q = part(0, 0, seq), k = part(1, 0, seq), v = part(2, 0, seq);
  timed(times, "rope", [&] {
    const TensorView cos = ditops::view(rope_cos_.data(), {seq, dim});
    const TensorView sin = ditops::view(rope_sin_.data(), {seq, dim});
    ditops::rotary_position_embedding(q, cos, sin, q, ditops::RotatedMode::rotated_interleaved);
    ditops::rotary_position_embedding(k, cos, sin, k, ditops::RotatedMode::rotated_interleaved);
  });
  std::vector<float>& attended = buffer(ws.attended, rows * hidden);
  timed(times, "attention", [&] {
    if (c.attention == AttentionKind::rainfusion) {
      // RainFusion plans one layout per call, so each sequence runs over its valid suffix
      // (its own text length); the padding rows it skips are set to zero.
      for (std::int64_t b = 0; b < batch; ++b) {
        const std::int64_t padding = c.text_tokens - text_lengths[static_cast<std::size_t>(b)];
        std::fill_n(attended.begin() + b * seq * hidden, padding * hidden, 0.f);
        const auto suffix = [&](const TensorView& t) {
          TensorView s = t;
          s.data = static_cast<float*>(t.data) + b * t.strides[0] + padding * t.strides[1];
          s.shape[0] = 1;
          s.shape[1] = seq - padding;
          return s;
        };
        ditops::RainFusionOptions rf;
        rf.video.frames = c.frames;
        rf.video.width = c.width();
        rf.video.height = c.image_tokens / c.frames / rf.video.width;
        rf.video.text_tokens = text_lengths[static_cast<std::size_t>(b)];
        const TensorView out = ditops::view(attended.data(), {batch, seq, heads, dim});
        ditops::rainfusion_attention(suffix(q), suffix(k), suffix(v), {}, suffix(out), rf);
      }
      return;
    }
    // Key-padding mask [batch, 1, 1, S]: one row per sequence, broadcast over heads and queries.
    std::unique_ptr<bool[]> keep(new bool[static_cast<std::size_t>(batch * seq)]);
    for (std::int64_t b = 0; b < batch; ++b) {
      const std::int64_t padding = c.text_tokens - text_lengths[static_cast<std::size_t>(b)];
      for (std::int64_t j = 0; j < seq; ++j) keep[b * seq + j] = j >= padding;
    }
    ditops::AttentionOptions options;
    options.attn_mask = ditops::view(keep.get(), {batch, 1, 1, seq});
    options.backend = c.attention == AttentionKind::int8 ? ditops::AttentionBackend::int8
                                                         : ditops::AttentionBackend::flash;
    ditops::attention_forward(q, k, v, ditops::view(attended.data(), {batch, seq, heads, dim}),
                              options);
  });
  std::vector<float>& projected = buffer(ws.projected, rows * hidden);
  stream_linear("out_proj", &StreamLayers::out, attended, projected);
  // projected *= the attention half's gate, for the residual add below.
  timed(times, "gate", [&] {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* g = mod(r, 2);
      float* row = projected.data() + r * hidden;
      for (std::int64_t i = 0; i < hidden; ++i) row[i] *= g[i];
    }
  });
  // x += gate * attention; normed = rms_norm(x): the residual add and the MLP half's norm in
  // one pass over memory.
  timed(times, "add_rms_norm", [&] {
    ditops::add_rms_norm(x_view, ditops::view(projected.data(), {rows, hidden}), {}, c.eps,
                         normed_view, x_view);
  });

  // ---- MLP half ----
  modulate(3);
  std::vector<float>& up = buffer(ws.up, rows * mlp);
  // GELU (tanh approximation) in the layer's epilogue, on the tile still in registers: no pass
  // over the 4 x hidden columns of its own.
  stream_linear("mlp_up", &StreamLayers::mlp_up, normed, up, ditops::Activation::gelu_tanh);
  stream_linear("mlp_down", &StreamLayers::mlp_down, up, projected);
  // x += gate * MLP, in one pass (no norm follows inside the block).
  timed(times, "gated_residual", [&] {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (std::int64_t r = 0; r < rows; ++r) {
      const float* g = mod(r, 5);
      const float* row = projected.data() + r * hidden;
      float* out = x.data() + r * hidden;
      for (std::int64_t i = 0; i < hidden; ++i) out[i] += g[i] * row[i];
    }
  });
}

void run_cfg(const DitBlock& block, int blocks, CfgMode mode, float guidance_scale,
             std::span<float> x, std::span<const float> conditioning,
             std::span<const std::int64_t> text_lengths, std::span<float> guided, OpTimes* times,
             DitWorkspace* workspace) {
  DitWorkspace local;
  if (!workspace) workspace = &local;
  const std::int64_t seq = block.config().sequence(), hidden = block.config().hidden;
  const auto tokens = static_cast<std::size_t>(seq * hidden);
  if (text_lengths.size() != 2 || x.size() != 2 * tokens || guided.size() != tokens) {
    throw ditops::Error("run_cfg: x must hold [2, S, hidden] (cond, uncond), guided [S, hidden]");
  }
  for (int i = 0; i < blocks; ++i) {
    if (mode == CfgMode::fused) {
      block.forward(x, conditioning, text_lengths, times, workspace);
    } else {
      for (std::size_t b = 0; b < 2; ++b) {
        block.forward(x.subspan(b * tokens, tokens),
                      conditioning.subspan(b * static_cast<std::size_t>(hidden),
                                           static_cast<std::size_t>(hidden)),
                      text_lengths.subspan(b, 1), times, workspace);
      }
    }
  }
  timed(times, "cfg_combine", [&] {
    ditops::cfg_combine(ditops::view(x.data(), {seq, hidden}),
                        ditops::view(x.data() + tokens, {seq, hidden}), guidance_scale,
                        ditops::view(guided.data(), {seq, hidden}));
  });
}

CfgInput random_cfg_input(const DitBlockConfig& config, std::uint32_t seed,
                          std::int64_t unconditional_text) {
  CfgInput input;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  input.x.resize(static_cast<std::size_t>(2 * config.sequence() * config.hidden));
  for (float& v : input.x) v = normal(rng);
  input.conditioning.resize(static_cast<std::size_t>(2 * config.hidden));
  for (float& v : input.conditioning) v = normal(rng);
  input.text_lengths = {config.text_tokens, unconditional_text};
  return input;
}

}  // namespace dit
