// Safetensors weights files on any contents, through QuantModel::load as a user loads a model:
// the bytes are the weights of a fixed description (a W8A8_DYNAMIC layer "l" and a FLOAT layer
// "f"). Whatever the file says, opening it either throws ditops::Error or yields tensors whose
// bytes match their shapes and overlap no other tensor's; a model that loads builds layer "l"
// and runs it (the sanitizers watch every read of the mapping).

#include <cstdint>
#include <cstdlib>
#include <ditops/quant_model.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz/support.hpp"
#include "loader/safetensors.hpp"

namespace ditops::fuzz {
namespace {

/// A directory of this process holding the fixed description; the weights are rewritten per
/// input. Removed when the process exits (never destroyed itself, so the exit handler can still
/// read it).
const std::string& model_dir() {
  static const std::string* const dir = [] {
    const auto* path = new std::string(scratch_path("ditops-safetensors-fuzz"));
    std::filesystem::create_directories(*path);
    std::ofstream(*path + "/quant_model_description_w8a8_dynamic.json")
        << R"({"model_quant_type": "W8A8_DYNAMIC", "l.weight": "W8A8_DYNAMIC",)"
        << R"( "l.weight_scale": "W8A8_DYNAMIC", "l.bias": "W8A8_DYNAMIC", "f.weight": "FLOAT"})";
    std::atexit([] {
      std::error_code error;
      std::filesystem::remove_all(model_dir(), error);
    });
    return path;
  }();
  return *dir;
}

void check_tensors(const loader::SafetensorsFile& file) {
  std::vector<const loader::SafetensorsTensor*> tensors;
  for (const std::string& name : file.names()) tensors.push_back(&file.get(name));
  for (const auto* tensor : tensors) {
    if (tensor->numel() * loader::safetensors_dtype_size(tensor->dtype) != tensor->bytes) {
      failure("tensor " + tensor->name + ": bytes do not match its shape");
    }
    for (const auto* other : tensors) {
      if (other == tensor || tensor->bytes == 0 || other->bytes == 0) continue;
      if (tensor->data < other->data + other->bytes && other->data < tensor->data + tensor->bytes) {
        failure("tensors " + tensor->name + " and " + other->name + " overlap");
      }
    }
  }
}

}  // namespace
}  // namespace ditops::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ditops;
  const std::string weights = fuzz::model_dir() + "/quant_model_weight_w8a8_dynamic.safetensors";
  {
    std::ofstream file(weights, std::ios::binary | std::ios::trunc);
    file.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  set_num_threads(1);
  try {
    fuzz::check_tensors(loader::SafetensorsFile::open(weights));
  } catch (const Error&) {
    return 0;
  }
  try {
    const QuantModel model =
        QuantModel::load(fuzz::model_dir() + "/quant_model_description_w8a8_dynamic.json");
    const QuantLinear layer = model.linear("l");
    // Bounded work per input: a huge layer the file describes validly is not run.
    if (layer.in_features() * layer.out_features() > (1 << 16)) return 0;
    std::vector<float> x(static_cast<std::size_t>(2 * layer.in_features()), 0.5f);
    std::vector<float> y(static_cast<std::size_t>(2 * layer.out_features()));
    layer.forward(view(x.data(), {2, layer.in_features()}),
                  view(y.data(), {2, layer.out_features()}));
    try {
      model.linear("f");
    } catch (const Error&) {
    }
  } catch (const Error&) {
  }
  return 0;
}
