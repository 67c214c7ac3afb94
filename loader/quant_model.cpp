// QuantModel: an msmodelslim description JSON and its safetensors weights, turned into
// QuantLinear layers. The weights stay memory-mapped while the model lives; layers copy and pack
// what they need, so a layer outlives the model that built it.

#include <cmath>
#include <cstring>
#include <deque>
#include <ditops/quant_model.hpp>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "loader/quant_files.hpp"
#include "loader/safetensors.hpp"
#include "ops/core/check.hpp"
#include "ops/core/file.hpp"
#include "ops/core/scratch.hpp"

namespace ditops {

struct QuantModel::Files {
  std::string description_path;
  QuantAlgo model_algo = QuantAlgo::w8a8_static;
  /// Every key of the description but model_quant_type, with its algorithm.
  std::map<std::string, QuantAlgo, std::less<>> keys;
  std::vector<std::string> layer_names;
  loader::SafetensorsFile weights;
};

namespace {

using loader::SafetensorsTensor;

/// Where a layer's description entry is, and so where its tensors are.
struct LayerKey {
  std::string prefix;  ///< of the layer's tensors: `name`, or `name.linear` when smoothed
  QuantAlgo algo;
};

std::string concat(std::string_view a, std::string_view b) {
  std::string joined(a);
  joined += b;
  return joined;
}

/// Whether layer `name` has SmoothQuant factors (`name.div.mul_scale`), in the description or
/// in the weights file.
bool has_smoothing(const QuantModel::Files& files, std::string_view name) {
  const std::string factors = concat(name, loader::kSmoothScale);
  return files.keys.contains(factors) || files.weights.find(factors) != nullptr;
}

std::optional<LayerKey> find_layer(const QuantModel::Files& files, std::string_view name) {
  const std::string base(name);
  // A smoothed layer's entry is `name.linear.weight`; without factors that key belongs to a
  // layer named `name.linear` (diffusers' AdaLayerNorm has such modules).
  if (has_smoothing(files, name)) {
    const std::string wrapped = concat(name, loader::kSmoothedLinear);
    const auto it = files.keys.find(concat(wrapped, loader::kWeight));
    if (it != files.keys.end()) return LayerKey{wrapped, it->second};
  }
  // The other key forms a layer may be described under; the first present wins (a
  // description holds one of them per layer).
  for (const std::string& key :
       {concat(name, loader::kWeight), base, concat(name, loader::kQuantType)}) {
    const auto it = files.keys.find(key);
    if (it != files.keys.end()) return LayerKey{base, it->second};
  }
  return std::nullopt;
}

/// Suffixes of description keys that name a layer's auxiliary tensor, not a layer.
bool is_auxiliary_key(std::string_view key) {
  for (const std::string_view suffix :
       {loader::kBias, loader::kQuantBias, loader::kDeqScale, loader::kInputScale,
        loader::kInputOffset, loader::kWeightScale, loader::kWeightOffset, loader::kSmoothScale}) {
    if (key.ends_with(suffix)) return true;
  }
  return false;
}

std::vector<std::string> layer_names_of(const QuantModel::Files& files) {
  std::set<std::string> names;
  for (const auto& entry : files.keys) {
    const std::string_view key = entry.first;
    if (key.ends_with(loader::kWeight)) {
      std::string_view name = key.substr(0, key.size() - loader::kWeight.size());
      if (name.ends_with(loader::kSmoothedLinear)) {
        const std::string_view unwrapped =
            name.substr(0, name.size() - loader::kSmoothedLinear.size());
        if (has_smoothing(files, unwrapped)) name = unwrapped;
      }
      names.emplace(name);
    } else if (key.ends_with(loader::kQuantType)) {
      names.emplace(key.substr(0, key.size() - loader::kQuantType.size()));
    } else if (!is_auxiliary_key(key)) {
      names.emplace(key);
    }
  }
  return {names.begin(), names.end()};
}

/// The tensors a layer of `algo` reads, for messages about one it does not.
const char* tensors_read(QuantAlgo algo) {
  switch (algo) {
    case QuantAlgo::float_linear:
      return "weight, bias";
    case QuantAlgo::w8a8_static:
      return "weight, quant_bias, deq_scale, input_scale, input_offset, bias";
    case QuantAlgo::w8a8_dynamic:
      return "weight, weight_scale, weight_offset, bias";
    case QuantAlgo::w8a8_timestep:
      return "weight, weight_scale, weight_offset, input_scale, input_offset, bias";
  }
  return "";
}

/// Reads one layer's tensors from the weights file into W8A8Tensors (or a FLOAT layer's weight
/// and bias): dtypes and shapes checked, per-feature parameters widened to f32 copies it owns,
/// int8 weights viewed in the mapping. Every error names the call, the layer, the tensor and
/// the weights file.
class LayerTensors {
 public:
  LayerTensors(const char* call, const QuantModel::Files& files, std::string_view name)
      : call_(call), files_(files), name_(name) {
    const auto key = find_layer(files, name);
    if (!key) {
      throw Error(std::string(call) + ": no layer \"" + name_ + "\" in " + files.description_path +
                  " (none of the keys " + name_ + ".weight, " + name_ + ", " + name_ +
                  ".quant_type, or " + name_ + ".linear.weight beside " + name_ +
                  ".div.mul_scale)");
    }
    prefix_ = key->prefix;
    algo_ = key->algo;
  }

  QuantAlgo algo() const noexcept { return algo_; }

  W8A8Tensors w8a8() {
    W8A8Tensors tensors;
    tensors.weight = int8_weight();
    const std::int64_t out = tensors.weight.shape[0];
    const std::int64_t in = tensors.weight.shape[1];
    if (algo_ == QuantAlgo::w8a8_static) {
      tensors.quant_bias = int32_vector(loader::kQuantBias, out);
      tensors.deq_scale = f32_copy(required(loader::kDeqScale), {out}, Values::positive,
                                   /*int64_fp32_bits=*/true);
      tensors.input_scale = per_step(loader::kInputScale, Values::positive, /*single=*/true);
      tensors.input_offset = per_step(loader::kInputOffset, Values::finite, /*single=*/true);
    } else {
      tensors.weight_scale = f32_copy(required(loader::kWeightScale), {out}, Values::positive);
      check_symmetric_weights(out);
      if (algo_ == QuantAlgo::w8a8_timestep) {
        tensors.input_scale = per_step(loader::kInputScale, Values::positive, false);
        tensors.input_offset = per_step(loader::kInputOffset, Values::finite, false);
        if (tensors.input_scale.shape[0] != tensors.input_offset.shape[0]) {
          fail(tensor_name(loader::kInputOffset),
               "has " + std::to_string(tensors.input_offset.shape[0]) + " steps but " +
                   tensor_name(loader::kInputScale) + " has " +
                   std::to_string(tensors.input_scale.shape[0]));
        }
      }
    }
    tensors.bias = optional_f32(loader::kBias, out);
    tensors.smooth_scale = smoothing(in);
    check_all_read();
    return tensors;
  }

  /// A FLOAT layer's weight (f32 or bf16 [out, in]) and bias (f32 [out] or empty). SmoothQuant
  /// factors, where a layer that fell back to FLOAT kept them, are folded into an f32 weight:
  /// (x · m) · Wᵀ = x · (W · diag(m))ᵀ.
  std::pair<TensorView, TensorView> float_weights() {
    const SafetensorsTensor& weight = required(loader::kWeight);
    check_dtype(weight, {"F32", "F16", "BF16"});
    check_rank2(weight);
    const TensorView factors = smoothing(weight.shape[1]);
    TensorView weight_view;
    if (weight.dtype == "BF16" && factors.empty()) {
      weight_view = aligned_or_copy<std::uint16_t>(weight);
      weight_view.dtype = DType::bf16;
    } else {
      weight_view = f32_copy(weight, weight.shape, Values::any);
      auto* values = static_cast<float*>(weight_view.data);
      const auto* scale = static_cast<const float*>(factors.data);
      const std::int64_t in = weight.shape[1];
      for (std::int64_t i = 0; !factors.empty() && i < weight.numel(); ++i) {
        values[i] *= scale[i % in];
      }
    }
    const TensorView bias = optional_f32(loader::kBias, weight.shape[0]);
    check_all_read();
    return {weight_view, bias};
  }

 private:
  enum class Values { any, finite, positive };

  std::string tensor_name(std::string_view suffix) const { return prefix_ + std::string(suffix); }

  [[noreturn]] void fail(const std::string& tensor, const std::string& problem) const {
    throw Error(std::string(call_) + ": layer \"" + name_ + "\" (" + quant_algo_name(algo_) +
                "): tensor \"" + tensor + "\" in " + files_.weights.path() + " " + problem);
  }

  /// The tensor of that name, or null; remembered as read (check_all_read).
  const SafetensorsTensor* find(const std::string& tensor) {
    const SafetensorsTensor* found = files_.weights.find(tensor);
    if (found) read_.insert(tensor);
    return found;
  }

  const SafetensorsTensor& required(std::string_view suffix) {
    const std::string tensor = tensor_name(suffix);
    const SafetensorsTensor* found = find(tensor);
    if (!found) fail(tensor, "is missing");
    return *found;
  }

  /// The layer's SmoothQuant factors, f32 [in], or an empty view. They belong to the layer's
  /// name, not to its tensors' prefix (`name.div.mul_scale` beside `name.linear.weight`).
  TensorView smoothing(std::int64_t in) {
    const std::string name = concat(name_, loader::kSmoothScale);
    const SafetensorsTensor* factors = find(name);
    if (!factors) {
      if (files_.keys.contains(name)) fail(name, "is missing (the description lists it)");
      return {};
    }
    return f32_copy(*factors, {in}, Values::positive);
  }

  /// A tensor under the layer's name that the layer did not read is an Error: a name the
  /// loader does not understand (another algorithm's parameter, a misspelling, the other key
  /// form's copy) would otherwise be dropped and the layer computed without it. Tensors of
  /// modules below the layer (`name.proj.weight`) are theirs, not the layer's.
  void check_all_read() const {
    const std::string scope = name_ + ".";
    for (const std::string& tensor : files_.weights.names_with_prefix(scope)) {
      if (read_.contains(tensor)) continue;
      std::string_view rest = std::string_view(tensor).substr(scope.size());
      if (prefix_ != name_ && rest.starts_with(loader::kSmoothedLinear.substr(1))) {
        rest.remove_prefix(loader::kSmoothedLinear.size());
      }
      const bool layers = rest.find('.') == std::string_view::npos || rest.starts_with("div.");
      if (layers) {
        fail(tensor, std::string("is not used by a ") + quant_algo_name(algo_) +
                         " layer, which reads " + prefix_ + ".{" + tensors_read(algo_) + "} and " +
                         concat(name_, loader::kSmoothScale));
      }
    }
  }

  void check_dtype(const SafetensorsTensor& tensor,
                   std::initializer_list<std::string_view> allowed) const {
    std::string names;
    for (const std::string_view dtype : allowed) {
      if (tensor.dtype == dtype) return;
      names += (names.empty() ? "" : " or ") + std::string(dtype);
    }
    fail(tensor.name, "has dtype " + tensor.dtype + ", expected " + names);
  }

  void check_rank2(const SafetensorsTensor& tensor) const {
    if (tensor.shape.size() != 2) {
      fail(tensor.name, "has shape " + tensor.shape_string() + ", expected [out, in]");
    }
  }

  TensorView int8_weight() {
    const SafetensorsTensor& weight = required(loader::kWeight);
    check_dtype(weight, {"I8"});
    check_rank2(weight);
    return weight.view(files_.weights.path());  // bytes: any address is aligned
  }

  /// Whether `tensor` holds `count` values as [count] or [count, 1] (or [] for count 1 when
  /// `scalar_ok`).
  bool holds_vector(const SafetensorsTensor& tensor, std::int64_t count, bool scalar_ok) const {
    const auto& shape = tensor.shape;
    return (shape.size() == 1 && shape[0] == count) ||
           (shape.size() == 2 && shape[0] == count && shape[1] == 1) ||
           (scalar_ok && count == 1 && shape.empty());
  }

  /// The tensor widened to an f32 copy of `shape`: a vector [count] (the tensor may be [count],
  /// [count, 1], or [] for one value) or a FLOAT layer's weight (its own shape). Every value is
  /// checked as `values` says.
  TensorView f32_copy(const SafetensorsTensor& tensor, std::vector<std::int64_t> shape,
                      Values values, bool int64_fp32_bits = false) {
    if (int64_fp32_bits) {
      check_dtype(tensor, {"I64", "F32"});
    } else {
      check_dtype(tensor, {"F32", "F16", "BF16"});
    }
    if (shape.size() == 1 && !holds_vector(tensor, shape[0], /*scalar_ok=*/shape[0] == 1)) {
      fail(tensor.name,
           "has shape " + tensor.shape_string() + ", expected [" + std::to_string(shape[0]) + "]");
    }
    std::vector<float>& copy = own(tensor.numel());
    for (std::int64_t i = 0; i < tensor.numel(); ++i) {
      const float value = element(tensor, i);
      const bool bad = (values == Values::finite && !std::isfinite(value)) ||
                       (values == Values::positive && !(std::isfinite(value) && value > 0));
      if (bad) {
        fail(tensor.name,
             "element " + std::to_string(i) + " is " + std::to_string(value) +
                 (values == Values::positive ? ", expected finite and > 0" : ", expected finite"));
      }
      copy[static_cast<std::size_t>(i)] = value;
    }
    TensorView result;
    result.data = copy.data();
    result.dtype = DType::f32;
    result.rank = static_cast<int>(shape.size());
    std::int64_t stride = 1;
    for (int d = result.rank - 1; d >= 0; --d) {
      result.shape[d] = shape[d];
      result.strides[d] = stride;
      stride *= shape[d];
    }
    return result;
  }

  TensorView optional_f32(std::string_view suffix, std::int64_t count,
                          Values values = Values::finite) {
    const SafetensorsTensor* tensor = find(tensor_name(suffix));
    return tensor ? f32_copy(*tensor, {count}, values) : TensorView{};
  }

  /// input_scale / input_offset: one value ([1], [] or [1, 1]) when `single`, else one per
  /// step ([T] or [T, 1]); an f32 [1] or [T] copy.
  TensorView per_step(std::string_view suffix, Values values, bool single) {
    const SafetensorsTensor& tensor = required(suffix);
    const std::int64_t steps = tensor.shape.empty() ? 1 : tensor.shape[0];
    if (!holds_vector(tensor, steps, true) || steps < 1 || (single && steps != 1)) {
      fail(tensor.name, "has shape " + tensor.shape_string() + ", expected " +
                            (single ? "[1] or []" : "[T] or [T, 1] (one value per step)"));
    }
    return f32_copy(tensor, {steps}, values);
  }

  TensorView int32_vector(std::string_view suffix, std::int64_t count) {
    const SafetensorsTensor& tensor = required(suffix);
    check_dtype(tensor, {"I32"});
    if (!holds_vector(tensor, count, false)) {
      fail(tensor.name,
           "has shape " + tensor.shape_string() + ", expected [" + std::to_string(count) + "]");
    }
    TensorView result = aligned_or_copy<std::int32_t>(tensor);
    result.rank = 1;
    result.shape[0] = count;
    result.strides[0] = 1;
    return result;
  }

  /// Dynamic and timestep layers compute with symmetric weights: a weight_offset, where
  /// msmodelslim writes one, must be all zeros.
  void check_symmetric_weights(std::int64_t out) {
    const SafetensorsTensor* offset = find(tensor_name(loader::kWeightOffset));
    if (!offset) return;
    const TensorView values = f32_copy(*offset, {out}, Values::finite);
    for (std::int64_t i = 0; i < out; ++i) {
      if (static_cast<const float*>(values.data)[i] != 0.f) {
        fail(offset->name,
             "element " + std::to_string(i) + " is not 0: asymmetric weights are not supported");
      }
    }
  }

  /// The tensor's view in the mapping when its data is aligned for T, else a copy.
  template <class T>
  TensorView aligned_or_copy(const SafetensorsTensor& tensor) {
    TensorView result = tensor.view(files_.weights.path());
    if (reinterpret_cast<std::uintptr_t>(tensor.data) % alignof(T) != 0) {
      core::check_allocation(tensor.numel(), sizeof(T));
      auto& copy = owned_bytes_.emplace_back(static_cast<std::size_t>(tensor.bytes));
      std::memcpy(copy.data(), tensor.data, static_cast<std::size_t>(tensor.bytes));
      result.data = copy.data();
    }
    return result;
  }

  float element(const SafetensorsTensor& tensor, std::int64_t index) const {
    if (tensor.dtype != "I64") return tensor.float_at(index);
    // msmodelslim's deq_scale: the fp32 bits in the low 32 bits of an int64.
    std::uint64_t bits64;
    std::memcpy(&bits64, tensor.data + index * 8, sizeof bits64);
    const auto bits = static_cast<std::uint32_t>(bits64 & 0xffffffffu);
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
  }

  std::vector<float>& own(std::int64_t count) {
    core::check_allocation(count, sizeof(float));
    return owned_floats_.emplace_back(static_cast<std::size_t>(count));
  }

  const char* call_;
  const QuantModel::Files& files_;
  std::string name_;
  std::string prefix_;
  QuantAlgo algo_ = QuantAlgo::float_linear;
  std::set<std::string> read_;  ///< names of the tensors looked up and found
  // Copies the views point into: a deque never moves its elements as it grows.
  std::deque<std::vector<float>> owned_floats_;
  struct AlignedBytes {
    explicit AlignedBytes(std::size_t bytes) : storage((bytes + 7) / 8) {}
    std::byte* data() { return reinterpret_cast<std::byte*>(storage.data()); }
    std::vector<std::uint64_t> storage;
  };
  std::deque<AlignedBytes> owned_bytes_;
};

[[noreturn]] void fail_description(const std::string& path, const std::string& problem) {
  throw Error("QuantModel::load: description " + path + ": " + problem);
}

}  // namespace

QuantModel QuantModel::load(const std::string& description_path, QuantModelOptions options) {
  const core::FileContents contents =
      core::read_regular_file(description_path, core::kMaxInputFileBytes, /*follow_symlink=*/true);
  if (contents.status != core::FileStatus::ok) {
    fail_description(description_path, contents.problem);
  }
  nlohmann::json document;
  try {
    document = nlohmann::json::parse(contents.text);
  } catch (const nlohmann::json::exception& error) {
    fail_description(description_path, std::string("not valid JSON: ") + error.what());
  }
  if (!document.is_object()) fail_description(description_path, "not a JSON object");

  const std::string global_key(loader::kModelQuantTypeKey);
  const auto global = document.find(global_key);
  if (global == document.end()) {
    fail_description(description_path, "has no \"" + global_key + "\" (the model's algorithm)");
  }
  const auto global_algo =
      global->is_string() ? loader::quant_algo_from_name(global->get<std::string>()) : std::nullopt;
  if (!global_algo || *global_algo == QuantAlgo::float_linear) {
    fail_description(description_path, "\"" + global_key + "\" is " + global->dump() +
                                           ", expected \"W8A8\", \"W8A8_DYNAMIC\" or "
                                           "\"W8A8_TIMESTEP\"");
  }
  std::map<std::string, QuantAlgo, std::less<>> keys;
  for (const auto& [key, value] : document.items()) {
    if (key == global_key) continue;
    const auto algo =
        value.is_string() ? loader::quant_algo_from_name(value.get<std::string>()) : std::nullopt;
    // Exports carry metadata beside the layer entries (a version, the KV-cache or attention
    // quantization of LLM exports); module names are dotted paths, so a dotless key whose
    // value is no algorithm is metadata, while a dotted one is a layer entry gone wrong.
    if (!algo && key.find('.') == std::string::npos) continue;
    if (!algo) {
      fail_description(description_path, "key \"" + key + "\" has unknown algorithm " +
                                             value.dump() +
                                             " (known: FLOAT, W8A8, W8A8_DYNAMIC, W8A8_TIMESTEP)");
    }
    keys.emplace(key, *algo);
  }

  std::string weights_path = std::move(options.weights_path);
  if (weights_path.empty()) {
    const std::filesystem::path description(description_path);
    const auto weights_name =
        loader::weight_file_for_description(description.filename().string(), *global_algo);
    if (!weights_name) {
      fail_description(description_path,
                       "its file name is neither " +
                           loader::description_file_name(*global_algo, -1) +
                           " nor the "
                           "multi-card form with _<rank>, so the weights file cannot be derived "
                           "from it "
                           "(set QuantModelOptions::weights_path)");
    }
    weights_path = (description.parent_path() / *weights_name).string();
  }
  Files loaded{description_path,
               *global_algo,
               std::move(keys),
               {},
               loader::SafetensorsFile::open(weights_path)};
  loaded.layer_names = layer_names_of(loaded);
  auto files = std::make_shared<const Files>(std::move(loaded));

  // Every quantized layer's tensors are checked now, so a broken file fails here and not at
  // the first linear(). FLOAT entries name every other tensor of the model too (norms,
  // embeddings), which need not be linear layers: those are checked when asked for.
  for (const std::string& name : files->layer_names) {
    LayerTensors layer("QuantModel::load", *files, name);
    if (layer.algo() != QuantAlgo::float_linear) layer.w8a8();
  }
  return QuantModel(std::move(files),
                    std::make_shared<Timestep>(std::move(options.timestep_policy)));
}

QuantAlgo QuantModel::model_algo() const noexcept { return files_->model_algo; }

QuantAlgo QuantModel::layer_algo(std::string_view name) const {
  return LayerTensors("QuantModel::layer_algo", *files_, name).algo();
}

std::vector<std::string> QuantModel::layer_names() const { return files_->layer_names; }

QuantLinear QuantModel::linear(std::string_view name) const {
  LayerTensors layer("QuantModel::linear", *files_, name);
  if (layer.algo() == QuantAlgo::float_linear) {
    const auto [weight, bias] = layer.float_weights();
    return QuantLinear::float_linear(weight, bias);
  }
  std::shared_ptr<const Timestep> timestep;
  if (layer.algo() == QuantAlgo::w8a8_timestep) timestep = timestep_;
  return QuantLinear::w8a8(layer.algo(), layer.w8a8(), std::move(timestep));
}

std::vector<float> QuantModel::float_tensor(std::string_view name) const {
  const loader::SafetensorsTensor* tensor = files_->weights.find(name);
  if (!tensor) {
    throw Error("QuantModel::float_tensor: no tensor \"" + std::string(name) + "\" in " +
                files_->weights.path());
  }
  if (tensor->dtype != "F32" && tensor->dtype != "F16" && tensor->dtype != "BF16") {
    throw Error("QuantModel::float_tensor: tensor \"" + std::string(name) + "\" in " +
                files_->weights.path() + " has dtype " + tensor->dtype +
                ", expected F32, F16 or BF16");
  }
  return tensor->to_floats(files_->weights.path());
}

QuantLinear QuantModel::fused_qkv(std::string_view q, std::string_view k,
                                  std::string_view v) const {
  return QuantLinear::concat_outputs({linear(q), linear(k), linear(v)});
}

}  // namespace ditops
