// Exports in msmodelslim's layout that ditops did not write: tests/fixtures/msmodelslim holds
// W8A8, W8A8_DYNAMIC (two cards) and W8A8_TIMESTEP exports written with the reference
// `safetensors` package by make_fixture.py, which also computed, with numpy alone, the output
// every layer must give and the bound the layer's arithmetic allows (the quantized layers' integer
// sums exact, then the fp32 epilogue). Every layer the descriptions list is checked.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <ditops/quant_model.hpp>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "loader/safetensors.hpp"

namespace ditops::test {
namespace {

using loader::SafetensorsFile;
using loader::SafetensorsTensor;

const std::filesystem::path kFixtures = std::filesystem::path(DITOPS_TEST_FIXTURES) / "msmodelslim";

std::vector<double> doubles(const SafetensorsTensor& tensor) {
  EXPECT_EQ(tensor.dtype, "F64") << tensor.name;
  std::vector<double> values(static_cast<std::size_t>(tensor.numel()));
  std::memcpy(values.data(), tensor.data, values.size() * sizeof(double));  // any alignment
  return values;
}

std::vector<std::string> descriptions_in(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("quant_model_description_")) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

/// Checks every layer output `expected` holds for description `description` of `dir`; returns
/// the names of the layers and floating-point tensors it checked.
std::set<std::string> check_description(const std::filesystem::path& dir,
                                        const std::string& description,
                                        const SafetensorsFile& expected) {
  const std::string prefix = description + ":";
  QuantModelOptions options;
  if (const SafetensorsTensor* steps = expected.find(prefix + "static_steps")) {
    for (std::int64_t i = 0; i < steps->numel(); ++i) {
      std::int32_t step;
      std::memcpy(&step, steps->data + i * 4, sizeof step);
      options.timestep_policy.set(step, TimestepMode::static_params);
    }
  }
  QuantModel model = QuantModel::load(dir / description, options);
  const SafetensorsTensor& x_tensor = expected.get("x");
  const std::vector<float> x = x_tensor.to_floats(expected.path());
  const std::int64_t rows = x_tensor.shape[0], in = x_tensor.shape[1];

  std::set<std::string> checked;
  for (const std::string& name : expected.names_with_prefix(prefix)) {
    const std::string key = name.substr(prefix.size());
    if (key.ends_with(":float")) {
      const std::string tensor = key.substr(0, key.size() - 6);
      EXPECT_EQ(model.float_tensor(tensor), expected.get(name).to_floats(expected.path()))
          << tensor;
      checked.insert(tensor.substr(0, tensor.rfind('.')));  // the norm's module
      continue;
    }
    if (!key.ends_with(":y")) continue;
    std::string layer = key.substr(0, key.size() - 2);
    std::string what = description + " " + layer;
    if (const auto at = layer.find('@'); at != std::string::npos) {
      model.set_timestep_step(std::stoi(layer.substr(at + 1)));
      layer.resize(at);
    }
    const SafetensorsTensor& y_tensor = expected.get(name);
    const std::vector<double> want = doubles(y_tensor);
    const std::vector<double> bound =
        doubles(expected.get(prefix + key.substr(0, key.size() - 2) + ":bound"));
    const std::int64_t out = y_tensor.shape[1];
    const QuantLinear linear = model.linear(layer);
    EXPECT_EQ(linear.in_features(), in) << what;
    EXPECT_EQ(linear.out_features(), out) << what;
    if (linear.in_features() != in || linear.out_features() != out) continue;
    std::vector<float> y(static_cast<std::size_t>(rows * out));
    linear.forward(view(x.data(), {rows, in}), view(y.data(), {rows, out}));
    std::size_t misses = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
      if (std::fabs(y[i] - want[i]) <= bound[i]) continue;
      if (++misses <= 3) {
        ADD_FAILURE() << what << " element " << i << ": " << y[i] << " vs " << want[i] << " (bound "
                      << bound[i] << ")";
      }
    }
    EXPECT_EQ(misses, 0u) << what;
    checked.insert(layer);
  }
  // Nothing the description lists goes unchecked.
  const std::vector<std::string> listed = model.layer_names();
  EXPECT_EQ(checked, std::set<std::string>(listed.begin(), listed.end())) << description;
  return checked;
}

TEST(MsmodelslimExports, EveryLayerMatchesTheIndependentReference) {
  std::size_t descriptions = 0;
  for (const char* name : {"w8a8", "w8a8_dynamic", "w8a8_timestep"}) {
    const std::filesystem::path dir = kFixtures / name;
    const SafetensorsFile expected = SafetensorsFile::open(dir / "expected.safetensors");
    for (const std::string& description : descriptions_in(dir)) {
      SCOPED_TRACE(description);
      EXPECT_GE(check_description(dir, description, expected).size(), 2u);
      ++descriptions;
    }
  }
  EXPECT_EQ(descriptions, 4u);  // the dynamic export has two cards
}

TEST(MsmodelslimExports, SmoothQuantLayersAreTheWrappedModules) {
  const QuantModel model =
      QuantModel::load(kFixtures / "w8a8" / "quant_model_description_w8a8.json");
  const std::string block = "transformer_blocks.0.";
  EXPECT_EQ(
      model.layer_names(),
      (std::vector<std::string>{block + "attn.norm_q", block + "attn.to_k", block + "attn.to_out.0",
                                block + "attn.to_q", block + "attn.to_v", block + "ff.net.0.proj",
                                block + "norm1.linear"}));
  EXPECT_EQ(model.layer_algo(block + "attn.to_k"), QuantAlgo::w8a8_static);
  EXPECT_EQ(model.layer_algo(block + "attn.to_v"), QuantAlgo::w8a8_dynamic);
  EXPECT_EQ(model.layer_algo(block + "norm1.linear"), QuantAlgo::float_linear);
}

}  // namespace
}  // namespace ditops::test
