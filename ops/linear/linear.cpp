// QuantLinear: validates a layer's tensors once, packs its weights for this CPU's kernel
// variant, and runs forward() as quantize-x-rows, then GEMM tiles over threads.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ditops/linear.hpp>
#include <string>
#include <vector>

#include "ops/core/check.hpp"
#include "ops/core/isa.hpp"
#include "ops/core/scratch.hpp"
#include "ops/core/threads.hpp"
#include "ops/linear/amx_gemm.hpp"
#include "ops/linear/gemm_kernel.hpp"

namespace ditops {

const char* quant_algo_name(QuantAlgo algo) noexcept {
  switch (algo) {
    case QuantAlgo::float_linear:
      return "FLOAT";
    case QuantAlgo::w8a8_static:
      return "W8A8";
    case QuantAlgo::w8a8_dynamic:
      return "W8A8_DYNAMIC";
    case QuantAlgo::w8a8_timestep:
      return "W8A8_TIMESTEP";
  }
  return "unknown";
}

TimestepPolicy& TimestepPolicy::set(int first, int last, TimestepMode mode) {
  if (first < 0 || last < first) {
    core::fail("TimestepPolicy::set", "steps " + std::to_string(first) + ".." +
                                          std::to_string(last) + " are not a range of steps >= 0");
  }
  ranges_.push_back({first, last, mode});
  return *this;
}

TimestepMode TimestepPolicy::mode_at(int step) const noexcept {
  // The last range that covers the step wins, so later calls override earlier ones.
  for (auto range = ranges_.rbegin(); range != ranges_.rend(); ++range) {
    if (range->first <= step && step <= range->last) return range->mode;
  }
  return TimestepMode::dynamic;
}

void Timestep::set_step(int step) {
  if (step < 0) core::fail("Timestep::set_step", "step (" + std::to_string(step) + ") < 0");
  step_.store(step, std::memory_order_release);
}

namespace {

using core::Arg;
using linear::GemmProblem;

/// The linear kernels of one variant (the member types: any instantiation's).
struct LinearKernels {
  decltype(&linear::int8_layout<xsimd::sse2>) int8_layout;
  decltype(&linear::f32_tile<xsimd::sse2>) f32_tile;
  decltype(&linear::quantize_rows<xsimd::sse2>) quantize_rows;
  decltype(&linear::f32_blocking<xsimd::sse2>) f32_blocking;
  decltype(&linear::gemm_int8<xsimd::sse2>) gemm_int8;
  decltype(&linear::gemm_f32<xsimd::sse2>) gemm_f32;
};

template <class Arch>
constexpr LinearKernels linear_kernels_of() {
  return {&linear::int8_layout<Arch>,  &linear::f32_tile<Arch>,  &linear::quantize_rows<Arch>,
          &linear::f32_blocking<Arch>, &linear::gemm_int8<Arch>, &linear::gemm_f32<Arch>};
}

/// The kernels of `variant`. By variant, not the active one: a layer keeps the variant its
/// panels were packed for (make_layer picks the baseline for weights holding -128 where the
/// active variant's int8 kernels are not exact for them) and runs that variant's kernels. The
/// table is constexpr: built at compile time, read without an initialization guard.
const LinearKernels& linear_kernels(int variant) {
  static constexpr core::IsaTable<LinearKernels> table = DITOPS_KERNEL_TABLE(linear_kernels_of);
  return table.of(variant);
}

using GemmInt8 = decltype(&linear::gemm_int8<xsimd::sse2>);

/// Whether a layer packed for `variant` runs its int8 (bf16) GEMM on AMX tiles: where the CPU,
/// the OS and DITOPS_ISA allow the unit, for the variant whose panels they take
/// (avx512+bf16+vnni).
bool uses_amx(int variant, core::AmxUnit unit = core::AmxUnit::int8) {
#if defined(DITOPS_AMX_COMPILED) && DITOPS_AMX_COMPILED
  return variant == core::kAvx512Bf16Variant && core::amx_usable(unit);
#else
  (void)variant;
  (void)unit;
  return false;
#endif
}

/// The int8 GEMM of a layer packed for `variant`: on AMX tiles (uses_amx), else the variant's.
GemmInt8 int8_gemm(int variant) {
#if defined(DITOPS_AMX_COMPILED) && DITOPS_AMX_COMPILED
  if (uses_amx(variant)) return &linear::amx::gemm_int8_amx<avx512_bf16>;
#endif
  return linear_kernels(variant).gemm_int8;
}

std::int64_t round_up(std::int64_t value, std::int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

/// What the constructors learned from the tensors, unpadded: the layer's definition, from which
/// make_layer packs (and concat_outputs re-packs after joining the parts).
struct LayerDefinition {
  QuantAlgo algo = QuantAlgo::float_linear;
  std::int64_t n = 0, k = 0;
  std::vector<std::int8_t> weight_s8;  ///< [n, k] (W8A8)
  std::vector<float> weight_f32;       ///< [n, k] (FLOAT of f32 weights)
  std::vector<bf16> weight_bf16;       ///< [n, k] (FLOAT of bf16 weights: kept at their size)
  bool bf16_weights = false;           ///< FLOAT: the weights are weight_bf16
  std::vector<float> weight_scale, deq_scale, bias, smooth, input_scale, input_offset;
  std::vector<std::int32_t> quant_bias;
  std::shared_ptr<const Timestep> timestep;
};

}  // namespace

struct QuantLinear::Impl {
  LayerDefinition definition;
  int variant = 0;  ///< kernel variant the panels are packed for
  /// f32 panels, or bf16 pairs (a FLOAT layer of bf16 weights on the avx512+bf16+vnni variant)
  DType weight_dtype = DType::f32;
  linear::TileShape tile;
  int activation_offset = 0;
  std::int64_t k_padded = 0, panels = 0, panel_bytes = 0;
  core::AlignedArray<std::uint8_t> packed;
  // Per column, padded to whole panels (the kernels load whole vectors).
  core::AlignedArray<std::int32_t> static_offset;  ///< quant_bias + vpdpbusd compensation
  core::AlignedArray<std::int32_t> compensation;   ///< -offset · Σ_k W (0 without vpdpbusd)
  core::AlignedArray<std::int32_t> column_sum;     ///< Σ_k W, for timestep static steps
  core::AlignedArray<float> deq_scale, weight_scale, bias;
};

namespace {

template <class T>
core::AlignedArray<T> padded_copy(const std::vector<T>& values, std::int64_t count) {
  auto array = core::aligned_array<T>(count);
  std::fill(array.get(), array.get() + count, T{});
  std::copy(values.begin(), values.end(), array.get());
  return array;
}

std::shared_ptr<const QuantLinear::Impl> make_layer(LayerDefinition definition) {
  auto layer = std::make_shared<QuantLinear::Impl>();
  const bool is_int8 = definition.algo != QuantAlgo::float_linear;
  const std::int64_t n = definition.n, k = definition.k;
  layer->variant = core::kernel_variant();
  if (is_int8) {
    // The sign trick of pmaddubsw levels multiplies weights in [-127, 127] exactly; a layer
    // holding -128 runs the baseline variant, whose widening multiply is exact for any byte.
    const bool has_minus_128 = std::find(definition.weight_s8.begin(), definition.weight_s8.end(),
                                         std::int8_t{-128}) != definition.weight_s8.end();
    if (has_minus_128 && !linear_kernels(layer->variant).int8_layout(n).exact_for_minus_128) {
      layer->variant = 0;
    }
  }
  const LinearKernels& kernels = linear_kernels(layer->variant);
  if (is_int8) {
    const linear::Int8Layout layout = kernels.int8_layout(n);
    layer->tile = layout.tile;
    layer->activation_offset = layout.activation_offset;
  } else {
    layer->tile = kernels.f32_tile(n);
  }
  const std::int64_t cols = layer->tile.cols;
  // bf16 weights on AVX512-BF16 stay bf16, in pairs of k (vdpbf16ps and the AMX B tiles take
  // them as they are): half the bytes of f32 panels. fp32 x widens the pairs as it loads them,
  // at the speed of f32 panels (gemm_kernel.cpp), so the layer keeps only the pairs.
  const bool bf16_pairs =
      !is_int8 && definition.bf16_weights && layer->variant == core::kAvx512Bf16Variant;
  if (bf16_pairs) layer->weight_dtype = DType::bf16;
  // 64 bytes of k per row (16 floats, 64 int8, 32 bf16: an AMX tile row): whole vectors of
  // every level, so quantize_rows and widen_rows store full vectors and the rows stay aligned.
  layer->k_padded = round_up(k, is_int8 ? 64 : bf16_pairs ? 32 : 16);
  layer->panels = (n + cols - 1) / cols;
  const std::int64_t element_bytes = is_int8 ? 1 : bf16_pairs ? 2 : 4;
  layer->panel_bytes = layer->k_padded * cols * element_bytes;
  const core::CheckedSize packed_bytes = core::CheckedSize(layer->panels) * layer->panel_bytes;
  layer->packed = core::aligned_array<std::uint8_t>(packed_bytes);
  std::memset(layer->packed.get(), 0, static_cast<std::size_t>(packed_bytes.value));
  const std::int64_t padded_n = layer->panels * cols;
  if (is_int8) {
    // Word (4 consecutive k) of column j of a panel at (k / 4) * cols * 4 + j * 4 + k % 4.
    auto* packed = reinterpret_cast<std::int8_t*>(layer->packed.get());
    std::vector<std::int32_t> column_sum(static_cast<std::size_t>(n), 0);
    for (std::int64_t row = 0; row < n; ++row) {
      std::int8_t* panel = packed + (row / cols) * layer->panel_bytes + (row % cols) * 4;
      const std::int8_t* src = definition.weight_s8.data() + row * k;
      for (std::int64_t i = 0; i < k; ++i) {
        panel[(i / 4) * cols * 4 + i % 4] = src[i];
        column_sum[static_cast<std::size_t>(row)] += src[i];
      }
    }
    std::vector<std::int32_t> compensation(column_sum.size());
    std::vector<std::int32_t> static_offset(column_sum.size());
    for (std::size_t j = 0; j < column_sum.size(); ++j) {
      compensation[j] = -layer->activation_offset * column_sum[j];
      if (!definition.quant_bias.empty()) {
        static_offset[j] = definition.quant_bias[j] + compensation[j];
      }
    }
    layer->column_sum = padded_copy(column_sum, padded_n);
    layer->compensation = padded_copy(compensation, padded_n);
    layer->static_offset = padded_copy(static_offset, padded_n);
    layer->deq_scale = padded_copy(definition.deq_scale, padded_n);
    layer->weight_scale = padded_copy(definition.weight_scale, padded_n);
  } else if (bf16_pairs) {
    // Pair (k = 2i, 2i + 1) of column j of a panel at words i · cols + j: bf16 k % 2 of it.
    auto* packed = reinterpret_cast<std::uint16_t*>(layer->packed.get());
    const std::int64_t panel_words = layer->panel_bytes / 2;
    for (std::int64_t row = 0; row < n; ++row) {
      std::uint16_t* panel = packed + (row / cols) * panel_words + (row % cols) * 2;
      const bf16* src = definition.weight_bf16.data() + row * k;
      for (std::int64_t i = 0; i < k; ++i) panel[(i / 2) * cols * 2 + i % 2] = src[i].bits;
    }
  } else {
    auto* packed = reinterpret_cast<float*>(layer->packed.get());
    const std::int64_t panel_floats = layer->panel_bytes / 4;
    for (std::int64_t row = 0; row < n; ++row) {
      float* panel = packed + (row / cols) * panel_floats + row % cols;
      if (definition.bf16_weights) {
        const bf16* src = definition.weight_bf16.data() + row * k;
        for (std::int64_t i = 0; i < k; ++i) panel[i * cols] = src[i].to_float();
      } else {
        const float* src = definition.weight_f32.data() + row * k;
        for (std::int64_t i = 0; i < k; ++i) panel[i * cols] = src[i];
      }
    }
  }
  layer->bias = padded_copy(definition.bias, padded_n);
  layer->definition = std::move(definition);
  return layer;
}

// ---- tensor validation -------------------------------------------------------------------------

/// Elements of a vector-like tensor: [count], [count, 1], or a scalar ([] / [1] / [1, 1]) when
/// count is 1; `count` -1 accepts any length >= 1.
std::int64_t vector_length(const Arg& arg, std::int64_t count) {
  core::check_view(arg, 0, 2);
  const TensorView& v = arg.view;
  const bool column = v.rank == 2 && v.shape[1] == 1;
  const std::int64_t length = v.rank == 0 ? 1 : v.shape[0];
  const bool shaped = v.rank <= 1 || column;
  if (!shaped || length < 1 || (count >= 0 && length != count)) {
    core::fail(
        arg.call,
        std::string(arg.name) + " has shape " + core::shape_string(v) + ", expected " +
            (count >= 0 ? "[" + std::to_string(count) + "] or [" + std::to_string(count) + ", 1]"
                        : std::string("[T] or [T, 1]")));
  }
  return length;
}

template <class T>
std::vector<T> read_vector(const Arg& arg, std::int64_t count, DType dtype) {
  const std::int64_t length = vector_length(arg, count);
  core::check_dtype(arg, {dtype});
  std::vector<T> values(static_cast<std::size_t>(length));
  const auto* data = static_cast<const T*>(arg.view.data);
  const std::int64_t stride = arg.view.rank == 0 ? 0 : arg.view.strides[0];
  for (std::int64_t i = 0; i < length; ++i) values[static_cast<std::size_t>(i)] = data[i * stride];
  return values;
}

/// f32 values, each finite (and > 0 when `positive`).
std::vector<float> read_floats(const Arg& arg, std::int64_t count, bool positive) {
  std::vector<float> values = read_vector<float>(arg, count, DType::f32);
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i]) || (positive && !(values[i] > 0.f))) {
      core::fail(arg.call, std::string(arg.name) + "[" + std::to_string(i) +
                               "] = " + std::to_string(values[i]) + " must be finite" +
                               (positive ? " and > 0" : ""));
    }
  }
  return values;
}

/// The [n, k] weight, row by row (any row stride).
template <class T, class Stored>
std::vector<T> read_matrix(const Arg& arg, const auto& convert) {
  const TensorView& w = arg.view;
  std::vector<T> values;
  core::checked_reserve(values, core::CheckedSize(w.shape[0]) * w.shape[1]);
  const auto* data = static_cast<const Stored*>(w.data);
  for (std::int64_t row = 0; row < w.shape[0]; ++row) {
    for (std::int64_t i = 0; i < w.shape[1]; ++i)
      values.push_back(convert(data[row * w.strides[0] + i]));
  }
  return values;
}

void check_weight_shape(const Arg& weight) {
  core::check_view(weight, 2, 2);
  if (weight.view.shape[0] < 1 || weight.view.shape[1] < 1) {
    core::fail(weight.call, std::string(weight.name) + " has shape " +
                                core::shape_string(weight.view) + ", expected [out >= 1, in >= 1]");
  }
}

std::vector<float> optional_bias(const char* call, const TensorView& bias, std::int64_t n) {
  if (bias.empty()) return {};
  return read_floats({call, "bias", bias}, n, false);
}

}  // namespace

QuantLinear QuantLinear::float_linear(const TensorView& weight, const TensorView& bias) {
  constexpr const char* kCall = "QuantLinear::float_linear";
  const core::CallScope scope(kCall);
  const Arg weight_arg{kCall, "weight", weight};
  check_weight_shape(weight_arg);
  core::check_dtype(weight_arg, {DType::f32, DType::bf16});
  LayerDefinition definition;
  definition.algo = QuantAlgo::float_linear;
  definition.n = weight.shape[0];
  definition.k = weight.shape[1];
  definition.bias = optional_bias(kCall, bias, definition.n);
  if (weight.dtype == DType::f32) {
    definition.weight_f32 = read_matrix<float, float>(weight_arg, [](float v) { return v; });
  } else {
    definition.weight_bf16 = read_matrix<bf16, bf16>(weight_arg, [](bf16 v) { return v; });
    definition.bf16_weights = true;
  }
  return QuantLinear(make_layer(std::move(definition)));
}

QuantLinear QuantLinear::w8a8(QuantAlgo algo, const W8A8Tensors& tensors,
                              std::shared_ptr<const Timestep> timestep) {
  constexpr const char* kCall = "QuantLinear::w8a8";
  const core::CallScope scope(kCall);
  if (algo != QuantAlgo::w8a8_static && algo != QuantAlgo::w8a8_dynamic &&
      algo != QuantAlgo::w8a8_timestep) {
    core::fail(kCall, std::string("algo (") + quant_algo_name(algo) +
                          ") must be W8A8, W8A8_DYNAMIC or W8A8_TIMESTEP");
  }
  if ((algo == QuantAlgo::w8a8_timestep) != (timestep != nullptr)) {
    core::fail(kCall, algo == QuantAlgo::w8a8_timestep
                          ? "timestep is required for W8A8_TIMESTEP"
                          : "timestep is only for W8A8_TIMESTEP layers");
  }
  const Arg weight_arg{kCall, "weight", tensors.weight};
  check_weight_shape(weight_arg);
  core::check_dtype(weight_arg, {DType::i8});
  LayerDefinition definition;
  definition.algo = algo;
  definition.n = tensors.weight.shape[0];
  definition.k = tensors.weight.shape[1];
  const std::int64_t n = definition.n;
  definition.bias = optional_bias(kCall, tensors.bias, n);
  if (!tensors.smooth_scale.empty()) {
    definition.smooth =
        read_floats({kCall, "smooth_scale", tensors.smooth_scale}, definition.k, true);
  }
  if (algo == QuantAlgo::w8a8_static) {
    definition.deq_scale = read_floats({kCall, "deq_scale", tensors.deq_scale}, n, true);
    definition.quant_bias =
        read_vector<std::int32_t>({kCall, "quant_bias", tensors.quant_bias}, n, DType::i32);
    definition.input_scale = read_floats({kCall, "input_scale", tensors.input_scale}, 1, true);
    definition.input_offset = read_floats({kCall, "input_offset", tensors.input_offset}, 1, false);
  } else {
    definition.weight_scale = read_floats({kCall, "weight_scale", tensors.weight_scale}, n, true);
  }
  if (algo == QuantAlgo::w8a8_timestep) {
    definition.input_scale = read_floats({kCall, "input_scale", tensors.input_scale}, -1, true);
    definition.input_offset =
        read_floats({kCall, "input_offset", tensors.input_offset},
                    static_cast<std::int64_t>(definition.input_scale.size()), false);
    for (std::size_t t = 0; t < definition.input_offset.size(); ++t) {
      // A static step takes input_offset · Σ_k W back from the int32 sums: exact for the
      // integer zero points quantizers produce.
      const float offset = definition.input_offset[t];
      if (offset != std::nearbyint(offset) || std::fabs(offset) > 128.f) {
        core::fail(kCall, "input_offset[" + std::to_string(t) + "] = " + std::to_string(offset) +
                              " must be an integer in [-128, 128]");
      }
    }
    definition.timestep = std::move(timestep);
  }
  definition.weight_s8 =
      read_matrix<std::int8_t, std::int8_t>(weight_arg, [](std::int8_t v) { return v; });
  return QuantLinear(make_layer(std::move(definition)));
}

QuantLinear QuantLinear::concat_outputs(const std::vector<QuantLinear>& parts) {
  constexpr const char* kCall = "QuantLinear::concat_outputs";
  const core::CallScope scope(kCall);
  if (parts.empty()) core::fail(kCall, "parts is empty");
  for (const QuantLinear& part : parts) {
    if (!part.impl_) core::fail(kCall, "a part is an empty layer");
  }
  const LayerDefinition& first = parts.front().impl_->definition;
  LayerDefinition joined;
  joined.algo = first.algo;
  joined.k = first.k;
  joined.timestep = first.timestep;
  joined.smooth = first.smooth;
  joined.input_scale = first.input_scale;
  joined.input_offset = first.input_offset;
  joined.bf16_weights = std::all_of(parts.begin(), parts.end(), [](const QuantLinear& part) {
    return part.impl_->definition.bf16_weights;
  });
  const bool any_bias = std::any_of(parts.begin(), parts.end(), [](const QuantLinear& part) {
    return !part.impl_->definition.bias.empty();
  });
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const LayerDefinition& part = parts[i].impl_->definition;
    const std::string which = "parts[" + std::to_string(i) + "]";
    if (part.algo != first.algo) {
      core::fail(kCall, which + " is " + quant_algo_name(part.algo) + ", parts[0] " +
                            quant_algo_name(first.algo));
    }
    if (part.k != first.k) {
      core::fail(kCall, which + " has " + std::to_string(part.k) + " input features, parts[0] " +
                            std::to_string(first.k));
    }
    if (part.timestep != first.timestep) {
      core::fail(kCall, which + " follows another model's timestep than parts[0]");
    }
    if (part.smooth != first.smooth || part.input_scale != first.input_scale ||
        part.input_offset != first.input_offset) {
      core::fail(kCall, which +
                            " quantizes its input differently from parts[0] (input_scale, "
                            "input_offset or smooth_scale differ): one GEMM reads one x");
    }
    joined.n += part.n;
    const auto append = [](auto& to, const auto& from) {
      to.insert(to.end(), from.begin(), from.end());
    };
    append(joined.weight_s8, part.weight_s8);
    if (joined.bf16_weights) {
      append(joined.weight_bf16, part.weight_bf16);
    } else if (part.bf16_weights) {  // beside f32 parts: widened, exactly
      for (const bf16 w : part.weight_bf16) joined.weight_f32.push_back(w.to_float());
    } else {
      append(joined.weight_f32, part.weight_f32);
    }
    append(joined.weight_scale, part.weight_scale);
    append(joined.deq_scale, part.deq_scale);
    append(joined.quant_bias, part.quant_bias);
    if (any_bias) {
      if (part.bias.empty()) {
        joined.bias.insert(joined.bias.end(), static_cast<std::size_t>(part.n), 0.f);
      } else {
        append(joined.bias, part.bias);
      }
    }
  }
  return QuantLinear(make_layer(std::move(joined)));
}

QuantAlgo QuantLinear::algo() const noexcept { return impl_->definition.algo; }
std::int64_t QuantLinear::in_features() const noexcept { return impl_->definition.k; }
std::int64_t QuantLinear::out_features() const noexcept { return impl_->definition.n; }
std::int64_t QuantLinear::weight_bytes() const noexcept {
  const std::int64_t padded_n = impl_->panels * impl_->tile.cols;
  const std::int64_t per_column = impl_->definition.algo == QuantAlgo::float_linear ? 4 : 6 * 4;
  return impl_->panels * impl_->panel_bytes + padded_n * per_column;
}

namespace {

/// Rows of x per task: a block whose int8 (f32) rows fill about 256 KiB, half of a 512 KiB L2,
/// stays cached while every panel of the task passes over it.
std::int64_t rows_per_block(std::int64_t row_bytes, int tile_rows) {
  constexpr std::int64_t kBlockBytes = 256 * 1024;
  const std::int64_t tiles =
      std::clamp<std::int64_t>(kBlockBytes / (row_bytes * tile_rows), 1, linear::kMaxBlockTiles);
  return tiles * tile_rows;
}

/// Whether a layer's packed weights stay in L2 by themselves (half of the smallest, 512 KiB):
/// a thin layer, 16-64 outputs of 3072 inputs, whose GEMM is short beside reading x.
bool weights_fit_l2(std::int64_t panels, std::int64_t panel_bytes) {
  constexpr std::int64_t kL2ResidentWeights = 256 * 1024;
  return panels * panel_bytes <= kL2ResidentWeights;
}

/// The FLOAT layer's GEMM: tasks of blocks of rows x chunks of panels as the kernel's blocking
/// asks (its rows of x are read from memory once per task, the panels' weights once per
/// block), split finer along the panels where there are too few for every thread to take
/// several (a few rows: decoding, small batches). Each thread's tasks share its scratch.
/// Weights that stay in L2 by themselves (a thin layer: 16 outputs of 3072 inputs are 192 KiB)
/// need no blocks of rows to be reused: there a task is one tile of rows, whose chunks of x
/// follow each other in memory, so the hardware prefetchers stream x (blocks of 120 rows read
/// x as 120 short runs per chunk: 0.42 of the FMA peak at 16 outputs, against 0.50).
void forward_f32(const LinearKernels& kernels, const GemmProblem& problem, std::int64_t panels,
                 std::int64_t padded_m, int tile_rows, int threads) {
  const linear::F32Blocking blocking = kernels.f32_blocking();
  const std::int64_t block_rows = std::min<std::int64_t>(
      weights_fit_l2(panels, problem.panel_bytes) ? tile_rows : blocking.block_rows, padded_m);
  const std::int64_t row_blocks = (padded_m + block_rows - 1) / block_rows;
  const std::int64_t panel_chunks =
      std::clamp<std::int64_t>(std::max((panels + blocking.task_panels - 1) / blocking.task_panels,
                                        (4 * threads + row_blocks - 1) / row_blocks),
                               1, panels);
  const std::int64_t panels_per_chunk = (panels + panel_chunks - 1) / panel_chunks;
  float* scratch = core::thread_scratch<float>(
      core::ScratchUse::linear_rows, core::CheckedSize(threads) * blocking.scratch_floats);
  core::parallel_tasks(row_blocks * panel_chunks, threads, [&](std::int64_t task, int thread) {
    const std::int64_t row_begin = (task / panel_chunks) * block_rows;
    const std::int64_t row_end = std::min(padded_m, row_begin + block_rows);
    const std::int64_t panel_begin = (task % panel_chunks) * panels_per_chunk;
    const std::int64_t panel_end = std::min(panels, panel_begin + panels_per_chunk);
    kernels.gemm_f32(problem, row_begin, row_end, panel_begin, panel_end,
                     scratch + thread * blocking.scratch_floats);
  });
}

constexpr const char* kForwardCall = "QuantLinear::forward";

/// x and y against the layer and each other, then the activation, then aliasing.
void check_forward(const LayerDefinition& definition, const Arg& x_arg, const Arg& y_arg,
                   Activation activation) {
  const TensorView &x = x_arg.view, &y = y_arg.view;
  core::check_view(x_arg, 1, kMaxRank);
  core::check_dtype(x_arg, {DType::f32, DType::bf16});
  core::check_view(y_arg, 1, kMaxRank);
  core::check_dtype(y_arg, {DType::f32, DType::bf16});
  if (x.shape[x.rank - 1] != definition.k) {
    core::fail(kForwardCall, "x has shape " + core::shape_string(x) +
                                 ", its last dimension must be in features (" +
                                 std::to_string(definition.k) + ")");
  }
  if (y.rank != x.rank || y.shape[y.rank - 1] != definition.n ||
      !std::equal(x.shape.begin(), x.shape.begin() + x.rank - 1, y.shape.begin())) {
    core::fail(kForwardCall, "y has shape " + core::shape_string(y) +
                                 ", expected x's leading shape and out features (" +
                                 std::to_string(definition.n) + ")");
  }
  if (activation != Activation::none && activation != Activation::gelu_tanh &&
      activation != Activation::silu) {
    core::fail(kForwardCall, "activation (" + std::to_string(static_cast<int>(activation)) +
                                 ") is not none, gelu_tanh or silu");
  }
  core::check_writable(y_arg);
  core::check_no_overlap(y_arg, x_arg, false);
}

/// The problem without the int8 epilogue's column offset and scale (activation_quant's).
GemmProblem make_problem(const QuantLinear::Impl& layer, const TensorView& x, const TensorView& y,
                         std::int64_t m, Activation activation) {
  const LayerDefinition& definition = layer.definition;
  GemmProblem problem;
  problem.m = m;
  problem.n = definition.n;
  problem.k = definition.k;
  problem.x_dtype = x.dtype;
  problem.y_dtype = y.dtype;
  problem.x = x.data;
  problem.rows = core::row_layout_of(x);
  problem.rows.strides[linear::kY] = core::row_layout_of(y).strides[0];
  problem.y = y.data;
  problem.panels = layer.packed.get();
  problem.weight_dtype = layer.weight_dtype;
  problem.panel_bytes = layer.panel_bytes;
  problem.columns = layer.tile.cols;
  problem.k_padded = layer.k_padded;
  problem.bias = definition.bias.empty() ? nullptr : layer.bias.get();
  problem.activation = activation;
  return problem;
}

/// A timestep layer's column offsets at a static step. They live in a buffer of the calling
/// thread that keeps its capacity: no allocation per call after the first.
const std::int32_t* static_step_offset(const QuantLinear::Impl& layer, std::int32_t offset) {
  thread_local std::vector<std::int32_t> step_offset;
  const std::int64_t padded_n = layer.panels * layer.tile.cols;
  step_offset.resize(static_cast<std::size_t>(padded_n));
  for (std::int64_t j = 0; j < padded_n; ++j) {
    step_offset[static_cast<std::size_t>(j)] = layer.compensation[j] - offset * layer.column_sum[j];
  }
  return step_offset.data();
}

/// How this call quantizes x, and the int8 epilogue's column offset and scale that go with it
/// (set in `problem`).
linear::ActivationQuant activation_quant(const QuantLinear::Impl& layer, GemmProblem& problem) {
  const LayerDefinition& definition = layer.definition;
  linear::ActivationQuant quant;
  quant.smooth = definition.smooth.empty() ? nullptr : definition.smooth.data();
  switch (definition.algo) {
    case QuantAlgo::float_linear:
      break;
    case QuantAlgo::w8a8_static:
      quant.scale = definition.input_scale[0];
      quant.offset = definition.input_offset[0];
      problem.column_offset = layer.static_offset.get();
      problem.column_scale = layer.deq_scale.get();
      break;
    case QuantAlgo::w8a8_dynamic:
    case QuantAlgo::w8a8_timestep: {
      quant.dynamic = true;
      problem.column_offset = layer.compensation.get();
      problem.column_scale = layer.weight_scale.get();
      if (definition.algo == QuantAlgo::w8a8_dynamic) break;
      const int step = definition.timestep->step();
      const auto steps = static_cast<int>(definition.input_scale.size());
      if (definition.timestep->policy().mode_at(step) != TimestepMode::static_params ||
          step >= steps) {
        break;
      }
      quant.dynamic = false;
      quant.scale = quant.row_scale = definition.input_scale[static_cast<std::size_t>(step)];
      quant.offset = definition.input_offset[static_cast<std::size_t>(step)];
      problem.column_offset = static_step_offset(layer, static_cast<std::int32_t>(quant.offset));
      break;
    }
  }
  return quant;
}

/// The int8 GEMM's tasks: blocks of rows x chunks of panels, enough of them for every thread
/// to take several (a few rows -- decoding, small batches -- split the panels instead).
struct Int8Tasks {
  std::int64_t padded_m, row_bytes, block_rows, row_blocks, panels, panel_chunks, panels_per_chunk;
};

/// Rows of x per task on AMX: whole blocks of 32 rows (the kernel's; a shorter block has half
/// the tile reuse), as many as fill 1 MiB, half of the 2 MiB L2 every CPU with AMX has, up to
/// linear::kMaxAmxRows (256 rows at k = 3072): each task streams the packed weights once, and
/// at the tiles' speed blocks of vpdpbusd size (80 rows there) would need 25 GB/s of weights per
/// core.
std::int64_t amx_rows_per_block(std::int64_t row_bytes) {
  constexpr std::int64_t kBlockBytes = 1024 * 1024, kAmxBlock = 32;
  return std::clamp<std::int64_t>(kBlockBytes / row_bytes / kAmxBlock, 1,
                                  linear::kMaxAmxRows / kAmxBlock) *
         kAmxBlock;
}

Int8Tasks int8_tasks(const QuantLinear::Impl& layer, std::int64_t padded_m, int threads, bool amx) {
  const std::int64_t row_bytes = layer.k_padded;
  const std::int64_t block_rows =
      amx ? amx_rows_per_block(row_bytes) : rows_per_block(row_bytes, layer.tile.rows);
  const std::int64_t row_blocks = (padded_m + block_rows - 1) / block_rows;
  const std::int64_t panel_chunks =
      std::clamp<std::int64_t>((4 * threads + row_blocks - 1) / row_blocks, 1, layer.panels);
  const std::int64_t panels_per_chunk = (layer.panels + panel_chunks - 1) / panel_chunks;
  return {padded_m,     row_bytes,    block_rows,      row_blocks,
          layer.panels, panel_chunks, panels_per_chunk};
}

/// A FLOAT layer of bf16 pairs with bf16 x on AMX tiles: x's rows copied first into one bf16
/// matrix (rows k_padded apart, zeros past k: whole A tiles), then tasks of blocks of rows (as
/// the int8 GEMM's on AMX) x chunks of panels.
void forward_bf16_amx(const GemmProblem& problem, std::int64_t panels, int threads) {
#if defined(DITOPS_AMX_COMPILED) && DITOPS_AMX_COMPILED
  const std::int64_t m = problem.m, k = problem.k, k_padded = problem.k_padded;
  const std::int64_t row_bytes = k_padded * static_cast<std::int64_t>(sizeof(bf16));
  bf16* a =
      core::thread_scratch<bf16>(core::ScratchUse::linear_rows, core::CheckedSize(m) * k_padded);
  const std::int64_t x_bytes = m * k * static_cast<std::int64_t>(sizeof(bf16));
  core::parallel_ranges(
      m, core::threads_for_bytes(x_bytes), [&](std::int64_t begin, std::int64_t end, int) {
        core::RowWalker<1> walker(problem.rows, begin);
        for (std::int64_t r = begin; r < end; ++r, walker.next()) {
          bf16* dst = a + r * k_padded;
          std::memcpy(dst, static_cast<const bf16*>(problem.x) + walker.offset(linear::kX),
                      static_cast<std::size_t>(k) * sizeof(bf16));
          std::memset(dst + k, 0, static_cast<std::size_t>(k_padded - k) * sizeof(bf16));
        }
      });
  const std::int64_t block_rows = amx_rows_per_block(row_bytes);
  const std::int64_t row_blocks = (m + block_rows - 1) / block_rows;
  const std::int64_t panel_chunks =
      std::clamp<std::int64_t>((4 * threads + row_blocks - 1) / row_blocks, 1, panels);
  const std::int64_t panels_per_chunk = (panels + panel_chunks - 1) / panel_chunks;
  core::parallel_tasks(row_blocks * panel_chunks, threads, [&](std::int64_t task, int) {
    const std::int64_t row_begin = (task / panel_chunks) * block_rows;
    const std::int64_t row_end = std::min(m, row_begin + block_rows);
    const std::int64_t panel_begin = (task % panel_chunks) * panels_per_chunk;
    const std::int64_t panel_end = std::min(panels, panel_begin + panels_per_chunk);
    linear::amx::gemm_bf16_amx<avx512_bf16>(problem, a + row_begin * k_padded, row_begin, row_end,
                                            panel_begin, panel_end);
  });
#else
  (void)problem;
  (void)panels;
  (void)threads;
#endif
}

/// Zeros for the rows past m a block's last tile computes but never stores (keeps them finite).
void zero_padding_rows(std::uint8_t* a, float* row_scale, std::int64_t rows,
                       std::int64_t row_bytes) {
  std::memset(a, 0, static_cast<std::size_t>(rows * row_bytes));
  std::fill(row_scale, row_scale + rows, 0.f);
}

/// A thin layer: each block of rows is one task, which quantizes its rows into its thread's
/// buffer and runs every panel over them while they are in L2, so x is read once and the int8
/// rows never go to memory (the GEMM is short beside that traffic). Wider layers quantize
/// first: at 3072 outputs, 1 thread, the fused tasks measured 5 % slower (x streamed through
/// L2 between the panels).
void forward_int8_fused(const LinearKernels& kernels, GemmInt8 gemm, const GemmProblem& problem,
                        const linear::ActivationQuant& quant, const Int8Tasks& tasks, int threads) {
  const std::int64_t m = problem.m, row_bytes = tasks.row_bytes, block_rows = tasks.block_rows;
  const std::int64_t thread_bytes = block_rows * (row_bytes + 4);
  std::uint8_t* scratch = core::thread_scratch<std::uint8_t>(
      core::ScratchUse::linear_rows, core::CheckedSize(threads) * thread_bytes);
  core::parallel_tasks(tasks.row_blocks, threads, [&](std::int64_t block, int thread) {
    const std::int64_t row_begin = block * block_rows;
    const std::int64_t row_end = std::min(tasks.padded_m, row_begin + block_rows);
    const std::int64_t stored_end = std::min(m, row_end);
    std::uint8_t* a = scratch + thread * thread_bytes;
    float* row_scale = reinterpret_cast<float*>(a + block_rows * row_bytes);
    kernels.quantize_rows(problem, quant, row_begin, stored_end, a, row_scale);
    zero_padding_rows(a + (stored_end - row_begin) * row_bytes,
                      row_scale + (stored_end - row_begin), row_end - stored_end, row_bytes);
    gemm(problem, a, row_scale, row_begin, row_end, 0, tasks.panels);
  });
}

/// Every row quantized first, for the tasks to share.
void forward_int8_shared(const LinearKernels& kernels, GemmInt8 gemm, const GemmProblem& problem,
                         const linear::ActivationQuant& quant, const Int8Tasks& tasks,
                         int threads) {
  const std::int64_t m = problem.m, padded_m = tasks.padded_m, row_bytes = tasks.row_bytes;
  const core::CheckedSize a_bytes = core::CheckedSize(padded_m) * row_bytes;
  std::uint8_t* scratch = core::thread_scratch<std::uint8_t>(
      core::ScratchUse::linear_rows, a_bytes + core::CheckedSize(padded_m) * 4);
  float* row_scale = reinterpret_cast<float*>(scratch + a_bytes.value);
  zero_padding_rows(scratch + m * row_bytes, row_scale + m, padded_m - m, row_bytes);
  const std::int64_t x_bytes = m * problem.k * dtype_size(problem.x_dtype);
  core::parallel_ranges(m, core::threads_for_bytes(x_bytes),
                        [&](std::int64_t begin, std::int64_t end, int) {
                          kernels.quantize_rows(problem, quant, begin, end,
                                                scratch + begin * row_bytes, row_scale + begin);
                        });
  core::parallel_tasks(tasks.row_blocks * tasks.panel_chunks, threads, [&](std::int64_t task, int) {
    const std::int64_t row_begin = (task / tasks.panel_chunks) * tasks.block_rows;
    const std::int64_t row_end = std::min(padded_m, row_begin + tasks.block_rows);
    const std::int64_t panel_begin = (task % tasks.panel_chunks) * tasks.panels_per_chunk;
    const std::int64_t panel_end = std::min(tasks.panels, panel_begin + tasks.panels_per_chunk);
    gemm(problem, scratch + row_begin * row_bytes, row_scale + row_begin, row_begin, row_end,
         panel_begin, panel_end);
  });
}

}  // namespace

void QuantLinear::forward(const TensorView& x, const TensorView& y) const {
  forward(x, y, Activation::none);
}

void QuantLinear::forward(const TensorView& x, const TensorView& y, Activation activation) const {
  constexpr const char* kCall = kForwardCall;
  const core::CallScope scope(kCall);
  if (!impl_) core::fail(kCall, "the layer is empty (default-constructed or moved from)");
  const Impl& layer = *impl_;
  const Arg x_arg{kCall, "x", x}, y_arg{kCall, "y", y};
  check_forward(layer.definition, x_arg, y_arg, activation);
  const std::int64_t m = core::numel(x) / layer.definition.k;
  if (m == 0) return;

  GemmProblem problem = make_problem(layer, x, y, m, activation);
  const linear::ActivationQuant quant = activation_quant(layer, problem);
  const LinearKernels& kernels = linear_kernels(layer.variant);
  const int threads = core::thread_count();
  const int tile_rows = layer.tile.rows;
  const std::int64_t padded_m = round_up(m, tile_rows);
  if (layer.definition.algo == QuantAlgo::float_linear) {
    if (layer.weight_dtype == DType::bf16 && x.dtype == DType::bf16 &&
        uses_amx(layer.variant, core::AmxUnit::bf16)) {
      forward_bf16_amx(problem, layer.panels, threads);
    } else {
      forward_f32(kernels, problem, layer.panels, padded_m, tile_rows, threads);
    }
    return;
  }
  const GemmInt8 gemm = int8_gemm(layer.variant);
  const Int8Tasks tasks = int8_tasks(layer, padded_m, threads, uses_amx(layer.variant));
  if (tasks.panel_chunks == 1 && weights_fit_l2(layer.panels, layer.panel_bytes)) {
    forward_int8_fused(kernels, gemm, problem, quant, tasks, threads);
  } else {
    forward_int8_shared(kernels, gemm, problem, quant, tasks, threads);
  }
}

}  // namespace ditops
