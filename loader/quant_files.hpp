#pragma once
// The names msmodelslim gives a quantized model's files and tensors, shared by the loader
// (QuantModel::load) and the writer (ditops-quantize), so both spell them one way.

#include <ditops/linear.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace ditops::loader {

/// The description's global-algorithm key.
inline constexpr std::string_view kModelQuantTypeKey = "model_quant_type";

/// Suffixes of a layer's tensors after its name (`blocks.0.attn.to_q` + ".deq_scale").
inline constexpr std::string_view kWeight = ".weight";
inline constexpr std::string_view kBias = ".bias";
inline constexpr std::string_view kQuantBias = ".quant_bias";
inline constexpr std::string_view kDeqScale = ".deq_scale";
inline constexpr std::string_view kInputScale = ".input_scale";
inline constexpr std::string_view kInputOffset = ".input_offset";
inline constexpr std::string_view kWeightScale = ".weight_scale";
inline constexpr std::string_view kWeightOffset = ".weight_offset";
/// SmoothQuant's per-input-feature factors of layer `name`: `name.div.mul_scale`, described as
/// FLOAT. msmodelslim's non-fused SmoothQuant wraps the layer: the factors go under `name.div`
/// and the layer's own tensors under `name.linear` (`name.linear.weight`, ...).
inline constexpr std::string_view kSmoothScale = ".div.mul_scale";
inline constexpr std::string_view kSmoothedLinear = ".linear";
/// A description key that names a layer's algorithm without naming a tensor.
inline constexpr std::string_view kQuantType = ".quant_type";

/// "FLOAT", "W8A8", ... (quant_algo_name's spelling) back to the algorithm; nullopt for any
/// other string.
std::optional<QuantAlgo> quant_algo_from_name(std::string_view name) noexcept;
/// "w8a8_dynamic": the algorithm's part of the file names.
std::string quant_algo_file_tag(QuantAlgo algo);

/// quant_model_description_{tag}[_{rank}].json; rank < 0: single-card export (no suffix).
std::string description_file_name(QuantAlgo algo, int rank);
/// quant_model_weight_{tag}[_{rank}].safetensors
std::string weight_file_name(QuantAlgo algo, int rank);
/// The weights file name a description file name implies (quant_model_description_w8a8_3.json
/// -> quant_model_weight_w8a8_3.safetensors), or nullopt when `file_name` is not a description
/// file name of `algo`.
std::optional<std::string> weight_file_for_description(std::string_view file_name, QuantAlgo algo);

}  // namespace ditops::loader
