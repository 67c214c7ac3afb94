#include "loader/quant_files.hpp"

#include <algorithm>
#include <cctype>

namespace ditops::loader {
namespace {

constexpr std::string_view kDescriptionStem = "quant_model_description_";
constexpr std::string_view kWeightStem = "quant_model_weight_";

std::string rank_suffix(int rank) { return rank < 0 ? "" : "_" + std::to_string(rank); }

}  // namespace

std::optional<QuantAlgo> quant_algo_from_name(std::string_view name) noexcept {
  for (const QuantAlgo algo : {QuantAlgo::float_linear, QuantAlgo::w8a8_static,
                               QuantAlgo::w8a8_dynamic, QuantAlgo::w8a8_timestep}) {
    if (name == quant_algo_name(algo)) return algo;
  }
  return std::nullopt;
}

std::string quant_algo_file_tag(QuantAlgo algo) {
  std::string tag = quant_algo_name(algo);
  std::transform(tag.begin(), tag.end(), tag.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return tag;
}

std::string description_file_name(QuantAlgo algo, int rank) {
  return std::string(kDescriptionStem) + quant_algo_file_tag(algo) + rank_suffix(rank) + ".json";
}

std::string weight_file_name(QuantAlgo algo, int rank) {
  return std::string(kWeightStem) + quant_algo_file_tag(algo) + rank_suffix(rank) + ".safetensors";
}

std::optional<std::string> weight_file_for_description(std::string_view file_name, QuantAlgo algo) {
  const std::string prefix = std::string(kDescriptionStem) + quant_algo_file_tag(algo);
  constexpr std::string_view kExtension = ".json";
  if (!file_name.starts_with(prefix) || !file_name.ends_with(kExtension)) return std::nullopt;
  // What lies between: nothing, or "_" and the rank's digits.
  const std::string_view rank =
      file_name.substr(prefix.size(), file_name.size() - prefix.size() - kExtension.size());
  if (!rank.empty()) {
    if (rank.size() < 2 || rank[0] != '_' ||
        !std::all_of(rank.begin() + 1, rank.end(),
                     [](unsigned char c) { return std::isdigit(c) != 0; })) {
      return std::nullopt;
    }
  }
  return std::string(kWeightStem) + quant_algo_file_tag(algo) + std::string(rank) + ".safetensors";
}

}  // namespace ditops::loader
