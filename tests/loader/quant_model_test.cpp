// QuantModel::load and the description file: algorithms, key forms, layer names, the weights
// file's name (rank suffix), and every missing, mistyped or misshapen layer tensor refused at
// load with an Error naming the file, the layer and the tensor. Also TimestepPolicy / Timestep.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <ditops/quant_model.hpp>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "loader/quant_files.hpp"
#include "loader/safetensors.hpp"
#include "tests/loader/files.hpp"
#include "tests/reference/linear_ref.hpp"
#include "tests/support/temp_dir.hpp"

namespace ditops::test {
namespace {

using loader::SafetensorsEntry;

std::int64_t fp32_bits(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

/// A model of one layer "blocks.0.attn.to_q" (out 2, in 3) written by hand, so each test can
/// drop, retype or reshape one tensor of it.
struct HandModel {
  QuantAlgo algo;
  std::map<std::string, SafetensorsEntry> tensors;
  nlohmann::json description;
  std::string layer = "blocks.0.attn.to_q";

  explicit HandModel(QuantAlgo algo_) : algo(algo_) {
    const std::string model_algo = quant_algo_name(algo);
    description = {{"model_quant_type", model_algo}};
    add(".weight", "I8", {2, 3}, bytes_of(std::vector<std::int8_t>{1, -2, 3, 4, 5, -6}));
    add(".bias", "F32", {2}, bytes_of(std::vector<float>{0.5f, -0.5f}));
    if (algo == QuantAlgo::w8a8_static) {
      add(".quant_bias", "I32", {2}, bytes_of(std::vector<std::int32_t>{3, -4}));
      add(".deq_scale", "I64", {2},
          bytes_of(std::vector<std::int64_t>{fp32_bits(0.01f), fp32_bits(0.02f)}));
      add(".input_scale", "F32", {1}, bytes_of(std::vector<float>{0.05f}));
      add(".input_offset", "F32", {1}, bytes_of(std::vector<float>{-3.f}));
    } else {
      add(".weight_scale", "F32", {2, 1}, bytes_of(std::vector<float>{0.1f, 0.2f}));
    }
    if (algo == QuantAlgo::w8a8_timestep) {
      add(".input_scale", "F32", {4, 1}, bytes_of(std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f}));
      add(".input_offset", "F16", {4},
          bytes_of(std::vector<std::uint16_t>{0x0000, 0x3c00, 0x4000, 0x4200}));
    }
    // A norm the description lists as FLOAT: not a linear layer, never checked as one.
    add_tensor("norm.weight", "F32", {3}, bytes_of(std::vector<float>{1, 1, 1}));
    description["norm.weight"] = "FLOAT";
  }

  /// The layer's tensor `suffix`, described with the model's algorithm.
  void add(const std::string& suffix, const char* dtype, std::vector<std::int64_t> shape,
           std::string bytes) {
    add_tensor(layer + suffix, dtype, std::move(shape), std::move(bytes));
    description[layer + suffix] = quant_algo_name(algo);
  }

  /// msmodelslim's non-fused SmoothQuant layout: the layer's tensors (and their description
  /// keys) move to `layer.linear.*`, the factors go to `layer.div.mul_scale`, described FLOAT.
  void smooth(const std::vector<float>& factors) {
    const std::string from = layer + ".", to = layer + ".linear.";
    std::map<std::string, SafetensorsEntry> moved;
    for (auto& [name, entry] : tensors) {
      const std::string renamed = name.starts_with(from) ? to + name.substr(from.size()) : name;
      entry.name = renamed;
      moved[renamed] = entry;
      if (renamed != name) {
        description[renamed] = description[name];
        description.erase(name);
      }
    }
    tensors = std::move(moved);
    add_tensor(layer + ".div.mul_scale", "F32", {static_cast<std::int64_t>(factors.size())},
               bytes_of(factors));
    description[layer + ".div.mul_scale"] = "FLOAT";
  }

  void add_tensor(const std::string& name, const char* dtype, std::vector<std::int64_t> shape,
                  std::string bytes) {
    // Each entry's bytes live in `storage`, where growing never moves them.
    storage.push_back(std::make_unique<std::string>(std::move(bytes)));
    tensors[name] = {name, dtype, std::move(shape), *storage.back()};
  }

  /// Writes the pair into `dir` (with an optional rank suffix); returns the description path.
  std::string write(const TempDir& dir, int rank = -1) const {
    std::vector<SafetensorsEntry> entries;
    for (const auto& entry : tensors) entries.push_back(entry.second);
    loader::write_safetensors(dir / loader::weight_file_name(algo, rank), entries);
    const std::string path = dir / loader::description_file_name(algo, rank);
    std::ofstream(path) << description.dump(1);
    return path;
  }

  /// The pair with the weights laid out as other writers may: a 1-byte tensor first and no
  /// padding, so every wider tensor starts misaligned.
  std::string write_unaligned(const TempDir& dir) const {
    nlohmann::json header = {{"pad", {{"dtype", "I8"}, {"shape", {1}}, {"data_offsets", {0, 1}}}}};
    std::string data(1, '\0');
    for (const auto& [name, entry] : tensors) {
      header[name] = {{"dtype", entry.dtype},
                      {"shape", entry.shape},
                      {"data_offsets", {data.size(), data.size() + entry.bytes.size()}}};
      data += entry.bytes;
    }
    write_raw_safetensors(dir / loader::weight_file_name(algo, -1), header.dump(), data);
    const std::string path = dir / loader::description_file_name(algo, -1);
    std::ofstream(path) << description.dump(1);
    return path;
  }

  std::vector<std::unique_ptr<std::string>> storage;
};

const std::vector<float> kX = {0.3f, -1.2f, 2.f, -0.7f, 0.1f, 0.9f};  // [2, 3]
const std::vector<std::int8_t> kWeight = {1, -2, 3, 4, 5, -6};        // HandModel's
const std::vector<float> kBias = {0.5f, -0.5f};

std::vector<float> run(const QuantLinear& layer) {
  std::vector<float> y(4);
  layer.forward(view(kX.data(), {2, 3}), view(y.data(), {2, 2}));
  return y;
}

/// y against the layer's output and the fp32 epilogue's bound.
void expect_near(const std::vector<float>& y, const EpilogueRef& ref) {
  ASSERT_EQ(y.size(), ref.expected.size());
  for (std::size_t i = 0; i < y.size(); ++i) {
    EXPECT_NEAR(y[i], ref.expected[i], ref.tolerance[i]) << "element " << i;
  }
}

/// The layer math of linear.hpp on kX. A static W8A8 layer's deq_scale already holds the
/// input scale: its row scale is 1.
EpilogueRef expected_y(const RefQuant& quant, const std::vector<float>& column_scale,
                       const std::vector<double>& column_offset, bool deq_scale = false) {
  std::vector<std::int32_t> q;
  std::vector<double> row_scale;
  quantize_ref(kX, 2, 3, quant, q, row_scale);
  if (deq_scale) row_scale.assign(row_scale.size(), 1.0);
  return epilogue_ref(int_matmul_ref(q, kWeight, 2, 2, 3), row_scale, column_scale, column_offset,
                      kBias, 2, 2, /*bf16_output=*/false);
}

/// QuantModel::load(path) throws an Error whose message holds every needle.
void expect_load_fails(const std::string& path, const std::vector<std::string>& needles,
                       QuantModelOptions options = {}) {
  try {
    QuantModel::load(path, std::move(options));
    ADD_FAILURE() << "no Error loading " << path;
  } catch (const Error& error) {
    const std::string message = error.what();
    for (const std::string& needle : needles) {
      EXPECT_NE(message.find(needle), std::string::npos) << "'" << message << "' lacks " << needle;
    }
  }
}

TEST(QuantModel, LoadsEveryAlgorithmAndNamesLayers) {
  for (const QuantAlgo algo :
       {QuantAlgo::w8a8_static, QuantAlgo::w8a8_dynamic, QuantAlgo::w8a8_timestep}) {
    SCOPED_TRACE(quant_algo_name(algo));
    const TempDir dir("ditops_quant_model");
    HandModel hand(algo);
    const QuantModel model = QuantModel::load(hand.write(dir));
    EXPECT_EQ(model.model_algo(), algo);
    EXPECT_EQ(model.layer_algo("blocks.0.attn.to_q"), algo);
    EXPECT_EQ(model.layer_algo("norm"), QuantAlgo::float_linear);
    EXPECT_EQ(model.layer_names(), (std::vector<std::string>{"blocks.0.attn.to_q", "norm"}));
    try {
      model.layer_algo("blocks.0.attn.to_k");
      ADD_FAILURE();
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("no layer \"blocks.0.attn.to_k\""),
                std::string::npos)
          << error.what();
    }
  }
}

TEST(QuantModel, KeyFormsNameALayer) {
  const TempDir dir("ditops_quant_model");
  HandModel hand(QuantAlgo::w8a8_dynamic);
  hand.description["a.linear.weight"] = "FLOAT";
  hand.description["b"] = "W8A8_TIMESTEP";
  hand.description["c.quant_type"] = "W8A8";
  hand.description["d.input_scale"] = "W8A8";  // a layer's tensor, no layer of its own
  // Quantized layers are checked at load: give b and c nothing, so only FLOAT "a" may stay.
  hand.description.erase("b");
  hand.description.erase("c.quant_type");
  const QuantModel model = QuantModel::load(hand.write(dir));
  // Without SmoothQuant factors `a.div.mul_scale`, `a.linear.weight` is a layer "a.linear"
  // (diffusers' AdaLayerNorm has such modules), not a smoothed layer "a".
  EXPECT_THROW(model.layer_algo("a"), Error);
  EXPECT_EQ(model.layer_algo("a.linear"), QuantAlgo::float_linear);
  EXPECT_EQ(model.layer_names(),
            (std::vector<std::string>{"a.linear", "blocks.0.attn.to_q", "norm"}));

  hand.description["b"] = "FLOAT";
  hand.description["c.quant_type"] = "FLOAT";
  const QuantModel more = QuantModel::load(hand.write(dir));
  EXPECT_EQ(more.layer_algo("b"), QuantAlgo::float_linear);
  EXPECT_EQ(more.layer_algo("c"), QuantAlgo::float_linear);
  EXPECT_EQ(more.layer_names(),
            (std::vector<std::string>{"a.linear", "b", "blocks.0.attn.to_q", "c", "norm"}));
}

TEST(QuantModel, DescriptionProblemsNameTheFileAndKey) {
  const TempDir dir("ditops_quant_model");
  HandModel hand(QuantAlgo::w8a8_static);
  std::string path = hand.write(dir);

  hand.description["blocks.1.ff.weight"] = "W4A16";
  path = hand.write(dir);
  expect_load_fails(path, {path, "key \"blocks.1.ff.weight\" has unknown algorithm \"W4A16\""});
  hand.description["blocks.1.ff.weight"] = 3;
  path = hand.write(dir);
  expect_load_fails(path, {path, "key \"blocks.1.ff.weight\" has unknown algorithm 3"});
  hand.description.erase("blocks.1.ff.weight");

  // Dotless keys whose value is no algorithm are an export's metadata, not layers.
  hand.description["version"] = "1.0.0";
  hand.description["kv_cache_type"] = "C8";
  path = hand.write(dir);
  const std::vector<std::string> names = QuantModel::load(path).layer_names();
  EXPECT_EQ(std::count(names.begin(), names.end(), "version"), 0);
  EXPECT_EQ(std::count(names.begin(), names.end(), "kv_cache_type"), 0);
  hand.description.erase("version");
  hand.description.erase("kv_cache_type");

  hand.description.erase("model_quant_type");
  path = hand.write(dir);
  expect_load_fails(path, {path, "has no \"model_quant_type\""});
  hand.description["model_quant_type"] = "FLOAT";
  path = hand.write(dir);
  expect_load_fails(path, {path, "\"model_quant_type\" is \"FLOAT\""});
  hand.description["model_quant_type"] = "W8A8";

  std::ofstream(path) << "{\"model_quant_type\": ";
  expect_load_fails(path, {path, "not valid JSON"});
  std::ofstream(path) << "[]";
  expect_load_fails(path, {path, "not a JSON object"});

  expect_load_fails(dir.path(), {dir.path(), "is a directory, not a regular file"});
  const std::string fifo = dir / "quant_model_description_w8a8_fifo.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_load_fails(fifo, {fifo, "is a FIFO, not a regular file"});
  // The weights given as a FIFO: refused, not blocked on.
  path = hand.write(dir);
  QuantModelOptions fifo_weights;
  fifo_weights.weights_path = fifo;
  expect_load_fails(path, {fifo, "is a FIFO, not a regular file"}, fifo_weights);
}

TEST(QuantModel, WeightsFileFollowsTheDescriptionsName) {
  EXPECT_EQ(loader::weight_file_for_description("quant_model_description_w8a8.json",
                                                QuantAlgo::w8a8_static),
            "quant_model_weight_w8a8.safetensors");
  EXPECT_EQ(loader::weight_file_for_description("quant_model_description_w8a8_dynamic_12.json",
                                                QuantAlgo::w8a8_dynamic),
            "quant_model_weight_w8a8_dynamic_12.safetensors");
  EXPECT_EQ(loader::weight_file_for_description("quant_model_description_w8a8_dynamic.json",
                                                QuantAlgo::w8a8_static),
            std::nullopt);  // "_dynamic" is no rank
  EXPECT_EQ(loader::weight_file_for_description("quant_model_description_w8a8_.json",
                                                QuantAlgo::w8a8_static),
            std::nullopt);
  EXPECT_EQ(loader::weight_file_for_description("model.json", QuantAlgo::w8a8_static),
            std::nullopt);

  const TempDir dir("ditops_quant_model");
  HandModel hand(QuantAlgo::w8a8_dynamic);
  const std::string ranked = hand.write(dir, 3);
  EXPECT_EQ(ranked, dir / "quant_model_description_w8a8_dynamic_3.json");
  EXPECT_EQ(QuantModel::load(ranked).model_algo(), QuantAlgo::w8a8_dynamic);

  // Rank 3's weights missing: the message names the file it looked for.
  std::filesystem::remove(dir / "quant_model_weight_w8a8_dynamic_3.safetensors");
  expect_load_fails(ranked, {"quant_model_weight_w8a8_dynamic_3.safetensors", "does not exist"});

  // A name the weights cannot be derived from; QuantModelOptions::weights_path names them.
  const std::string other = dir / "model.json";
  std::filesystem::copy_file(ranked, other);
  expect_load_fails(other, {other, "quant_model_description_w8a8_dynamic.json",
                            "QuantModelOptions::weights_path"});
  hand.write(dir);
  QuantModelOptions options;
  options.weights_path = dir / "quant_model_weight_w8a8_dynamic.safetensors";
  EXPECT_EQ(QuantModel::load(other, options).layer_names().size(), 2u);
}

/// Loading `hand` after `change` fails naming the layer, the tensor, the weights file and
/// `problem`.
template <class Change>
void expect_layer_refused(QuantAlgo algo, Change&& change, const std::string& tensor,
                          const std::string& problem) {
  const TempDir dir("ditops_quant_model");
  HandModel hand(algo);
  change(hand);
  const std::string path = hand.write(dir);
  expect_load_fails(path, {"layer \"blocks.0.attn.to_q\" (" + std::string(quant_algo_name(algo)),
                           "tensor \"blocks.0.attn.to_q" + tensor + "\"",
                           dir / loader::weight_file_name(algo, -1), problem});
}

TEST(QuantModel, LayerTensorsAreCheckedAtLoad) {
  const QuantAlgo st = QuantAlgo::w8a8_static, dyn = QuantAlgo::w8a8_dynamic,
                  ts = QuantAlgo::w8a8_timestep;
  const std::string layer = "blocks.0.attn.to_q";
  const auto drop = [&](const std::string& suffix) {
    return [=](HandModel& hand) { hand.tensors.erase(layer + suffix); };
  };
  expect_layer_refused(st, drop(".weight"), ".weight", "is missing");
  expect_layer_refused(st, drop(".deq_scale"), ".deq_scale", "is missing");
  expect_layer_refused(st, drop(".quant_bias"), ".quant_bias", "is missing");
  expect_layer_refused(st, drop(".input_scale"), ".input_scale", "is missing");
  expect_layer_refused(st, drop(".input_offset"), ".input_offset", "is missing");
  expect_layer_refused(dyn, drop(".weight_scale"), ".weight_scale", "is missing");
  expect_layer_refused(ts, drop(".input_offset"), ".input_offset", "is missing");

  expect_layer_refused(
      st,
      [&](HandModel& hand) {
        hand.add(".weight", "F32", {2, 3}, bytes_of(std::vector<float>(6, 1.f)));
      },
      ".weight", "has dtype F32, expected I8");
  expect_layer_refused(
      st, [&](HandModel& hand) { hand.add(".weight", "I8", {6}, std::string(6, '\1')); }, ".weight",
      "has shape [6], expected [out, in]");
  expect_layer_refused(
      st,
      [&](HandModel& hand) {
        hand.add(".quant_bias", "I64", {2}, bytes_of(std::vector<std::int64_t>{1, 2}));
      },
      ".quant_bias", "has dtype I64, expected I32");
  expect_layer_refused(
      st,
      [&](HandModel& hand) {
        hand.add(".deq_scale", "F32", {3}, bytes_of(std::vector<float>{1, 1, 1}));
      },
      ".deq_scale", "has shape [3], expected [2]");
  expect_layer_refused(
      st,
      [&](HandModel& hand) {
        hand.add(".deq_scale", "F16", {2}, bytes_of(std::vector<std::uint16_t>{0x3c00, 0x3c00}));
      },
      ".deq_scale", "has dtype F16, expected I64 or F32");
  expect_layer_refused(
      st,
      [&](HandModel& hand) {
        hand.add(".deq_scale", "F32", {2}, bytes_of(std::vector<float>{1.f, 0.f}));
      },
      ".deq_scale", "element 1 is 0.000000, expected finite and > 0");
  expect_layer_refused(
      st,
      [&](HandModel& hand) {
        hand.add(".input_scale", "F32", {2}, bytes_of(std::vector<float>{1.f, 1.f}));
      },
      ".input_scale", "has shape [2], expected [1] or []");
  expect_layer_refused(
      st, [&](HandModel& hand) { hand.add(".input_offset", "I8", {1}, std::string(1, '\0')); },
      ".input_offset", "has dtype I8, expected F32 or F16 or BF16");
  expect_layer_refused(
      st, [&](HandModel& hand) { hand.add(".bias", "F32", {3}, bytes_of(std::vector<float>(3))); },
      ".bias", "has shape [3], expected [2]");
  expect_layer_refused(
      dyn,
      [&](HandModel& hand) {
        hand.add(".div.mul_scale", "F32", {2}, bytes_of(std::vector<float>{1, 1}));
      },
      ".div.mul_scale", "has shape [2], expected [3]");
  expect_layer_refused(
      dyn,
      [&](HandModel& hand) {
        hand.add(".weight_offset", "F32", {2}, bytes_of(std::vector<float>{0.f, 1.f}));
      },
      ".weight_offset", "element 1 is not 0: asymmetric weights are not supported");
  expect_layer_refused(
      ts,
      [&](HandModel& hand) {
        hand.add(".input_offset", "F32", {3}, bytes_of(std::vector<float>{0, 0, 0}));
      },
      ".input_offset", "has 3 steps but blocks.0.attn.to_q.input_scale has 4");
}

TEST(QuantModel, TensorsALayerDoesNotReadAreRefused) {
  // Every tensor kind of the layouts, on each algorithm that does not read it, and parameters
  // of msmodelslim algorithms ditops does not run: none may be dropped silently.
  const std::vector<std::pair<QuantAlgo, std::vector<std::string>>> unread = {
      {QuantAlgo::w8a8_static, {".weight_scale", ".weight_offset", ".scale", ".kv_cache_scale"}},
      {QuantAlgo::w8a8_dynamic,
       {".deq_scale", ".quant_bias", ".input_scale", ".input_offset", ".scale_bias"}},
      {QuantAlgo::w8a8_timestep, {".deq_scale", ".quant_bias", ".left_trans", ".div.other"}},
  };
  for (const auto& [algo, suffixes] : unread) {
    for (const std::string& suffix : suffixes) {
      SCOPED_TRACE(std::string(quant_algo_name(algo)) + suffix);
      expect_layer_refused(
          algo,
          [&](HandModel& hand) {
            hand.add(suffix, "F32", {2}, bytes_of(std::vector<float>{1.f, 1.f}));
          },
          suffix, std::string("is not used by a ") + quant_algo_name(algo) + " layer");
    }
  }
  // A smoothed layer's tensors are under `.linear`: a copy under the other key form is stray.
  expect_layer_refused(
      QuantAlgo::w8a8_dynamic,
      [&](HandModel& hand) {
        hand.smooth({1.f, 1.f, 1.f});
        hand.add_tensor(hand.layer + ".weight_scale", "F32", {2},
                        bytes_of(std::vector<float>{1.f, 1.f}));
      },
      ".weight_scale", "blocks.0.attn.to_q.linear.{weight, weight_scale");
  // Tensors of modules below the layer are theirs: accepted.
  const TempDir dir("ditops_quant_model");
  HandModel hand(QuantAlgo::w8a8_dynamic);
  hand.add_tensor(hand.layer + ".proj.weight", "F32", {2}, bytes_of(std::vector<float>{1, 1}));
  EXPECT_NO_THROW(QuantModel::load(hand.write(dir)));
}

TEST(QuantModel, SmoothedLayersAreNamedAsMsmodelslimWrapsThem) {
  const TempDir dir("ditops_quant_model");
  HandModel hand(QuantAlgo::w8a8_static);
  hand.smooth({1.5f, 0.5f, 2.f});
  const QuantModel model = QuantModel::load(hand.write(dir));
  // Neither the wrapper's `.div` nor its `.linear` is a layer of its own.
  EXPECT_EQ(model.layer_names(), (std::vector<std::string>{"blocks.0.attn.to_q", "norm"}));
  EXPECT_EQ(model.layer_algo("blocks.0.attn.to_q"), QuantAlgo::w8a8_static);
  EXPECT_THROW(model.layer_algo("blocks.0.attn.to_q.div"), Error);

  // Factors the description lists must be in the weights file.
  hand.tensors.erase(hand.layer + ".div.mul_scale");
  expect_load_fails(hand.write(dir), {"tensor \"blocks.0.attn.to_q.div.mul_scale\"",
                                      "is missing (the description lists it)"});
}

TEST(QuantModel, AcceptedVariantsOfLayerTensors) {
  const TempDir dir("ditops_quant_model");
  HandModel hand(QuantAlgo::w8a8_static);
  // deq_scale as F32, scalar input_scale, BF16 offset, F16 smooth scale, [2, 1] quant_bias.
  hand.add(".deq_scale", "F32", {2}, bytes_of(std::vector<float>{0.01f, 0.02f}));
  hand.add(".input_scale", "F32", {}, bytes_of(std::vector<float>{0.05f}));
  hand.add(".input_offset", "BF16", {1, 1}, bytes_of(std::vector<std::uint16_t>{0xc040}));
  hand.add(".div.mul_scale", "F16", {3}, bytes_of(std::vector<std::uint16_t>(3, 0x3c00)));
  hand.add(".quant_bias", "I32", {2, 1}, bytes_of(std::vector<std::int32_t>{3, -4}));
  EXPECT_NO_THROW(QuantModel::load(hand.write(dir)));
}

TEST(TimestepPolicy, RangesOverridesAndDefault) {
  TimestepPolicy policy;
  EXPECT_EQ(policy.mode_at(0), TimestepMode::dynamic);  // nothing set: every step dynamic
  policy.set(0, 9, TimestepMode::static_params).set(5, TimestepMode::dynamic);
  EXPECT_EQ(policy.mode_at(0), TimestepMode::static_params);
  EXPECT_EQ(policy.mode_at(4), TimestepMode::static_params);
  EXPECT_EQ(policy.mode_at(5), TimestepMode::dynamic);  // the later call wins
  EXPECT_EQ(policy.mode_at(9), TimestepMode::static_params);
  EXPECT_EQ(policy.mode_at(10), TimestepMode::dynamic);
  EXPECT_EQ(policy.mode_at(-1), TimestepMode::dynamic);
  policy.set(3, 7, TimestepMode::static_params);
  EXPECT_EQ(policy.mode_at(5), TimestepMode::static_params);
  for (const auto& [first, last] : std::vector<std::pair<int, int>>{{-1, 3}, {4, 3}}) {
    try {
      policy.set(first, last, TimestepMode::dynamic);
      ADD_FAILURE();
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what())
                    .find("TimestepPolicy::set: steps " + std::to_string(first) + ".."),
                std::string::npos)
          << error.what();
    }
  }
}

TEST(Timestep, SetStepFromThreads) {
  Timestep timestep(TimestepPolicy().set(0, 49, TimestepMode::static_params));
  EXPECT_EQ(timestep.step(), 0);
  EXPECT_EQ(timestep.mode(), TimestepMode::static_params);
  EXPECT_THROW(timestep.set_step(-1), Error);
  EXPECT_EQ(timestep.step(), 0);  // unchanged by the refused call
  timestep.set_step(50);
  EXPECT_EQ(timestep.mode(), TimestepMode::dynamic);

  // Writers step through 0..99 while readers look: a reader only ever sees a step written.
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&] {
      for (int step = 0; step < 100000; ++step) timestep.set_step(step % 100);
    });
  }
  std::thread reader([&] {
    while (!stop.load()) {
      const int step = timestep.step();
      const TimestepMode mode = timestep.mode();
      if (step < 0 || step >= 100) ++bad;
      (void)mode;
    }
  });
  for (auto& thread : threads) thread.join();
  stop = true;
  reader.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(timestep.step(), 99);
}

TEST(QuantModel, ModelsKeepTheirOwnStep) {
  const TempDir dir("ditops_quant_model");
  HandModel hand(QuantAlgo::w8a8_timestep);
  const std::string path = hand.write(dir);
  QuantModelOptions options;
  options.timestep_policy.set(0, 4, TimestepMode::static_params);
  QuantModel a = QuantModel::load(path, options);
  QuantModel b = QuantModel::load(path, options);
  a.set_timestep_step(7);
  EXPECT_EQ(a.timestep()->step(), 7);
  EXPECT_EQ(a.timestep()->mode(), TimestepMode::dynamic);
  EXPECT_EQ(b.timestep()->step(), 0);
  EXPECT_EQ(b.timestep()->mode(), TimestepMode::static_params);
  EXPECT_THROW(a.set_timestep_step(-2), Error);
}

}  // namespace
}  // namespace ditops::test

namespace ditops::test {
namespace {

TEST(QuantModelLayers, ComputeTheirAlgorithm) {
  const double sum0 = 1 - 2 + 3, sum1 = 4 + 5 - 6;  // Σ_k W[n, k]
  {
    const TempDir dir("ditops_quant_model");
    const QuantModel model = QuantModel::load(HandModel(QuantAlgo::w8a8_static).write(dir));
    RefQuant quant;
    quant.scale = 0.05f;
    quant.offset = -3.f;
    expect_near(run(model.linear("blocks.0.attn.to_q")),
                expected_y(quant, {0.01f, 0.02f}, {3, -4}, /*deq_scale=*/true));
  }
  {
    const TempDir dir("ditops_quant_model");
    const QuantModel model = QuantModel::load(HandModel(QuantAlgo::w8a8_dynamic).write(dir));
    RefQuant quant;
    quant.dynamic = true;
    expect_near(run(model.linear("blocks.0.attn.to_q")), expected_y(quant, {0.1f, 0.2f}, {0, 0}));
  }
  {
    // Steps 0 and 1 static (input_scale[t], input_offset[t] = t), every other step dynamic.
    const TempDir dir("ditops_quant_model");
    QuantModelOptions options;
    options.timestep_policy.set(0, 1, TimestepMode::static_params);
    QuantModel model = QuantModel::load(HandModel(QuantAlgo::w8a8_timestep).write(dir), options);
    const QuantLinear layer = model.linear("blocks.0.attn.to_q");
    RefQuant dynamic;
    dynamic.dynamic = true;
    for (const int step : {1, 0, 3, 5}) {
      SCOPED_TRACE("step " + std::to_string(step));
      model.set_timestep_step(step);
      if (step <= 1) {
        RefQuant quant;
        quant.scale = step == 0 ? 0.1f : 0.2f;
        quant.offset = static_cast<float>(step);
        expect_near(run(layer),
                    expected_y(quant, {0.1f, 0.2f}, {-quant.offset * sum0, -quant.offset * sum1}));
      } else {
        expect_near(run(layer), expected_y(dynamic, {0.1f, 0.2f}, {0, 0}));
      }
    }
  }
}

TEST(QuantModelLayers, SmoothedLayersMultiplyXByTheirFactors) {
  const std::vector<float> factors = {1.5f, 0.25f, 4.f};
  for (const QuantAlgo algo :
       {QuantAlgo::w8a8_static, QuantAlgo::w8a8_dynamic, QuantAlgo::w8a8_timestep}) {
    SCOPED_TRACE(quant_algo_name(algo));
    const TempDir dir("ditops_quant_model");
    HandModel hand(algo);
    hand.smooth(factors);
    QuantModelOptions options;
    options.timestep_policy.set(0, TimestepMode::static_params);
    const QuantModel model = QuantModel::load(hand.write(dir), options);
    const std::vector<float> y = run(model.linear("blocks.0.attn.to_q"));
    RefQuant quant, unsmoothed;
    if (algo == QuantAlgo::w8a8_static) {
      quant.scale = 0.05f;
      quant.offset = -3.f;
    } else if (algo == QuantAlgo::w8a8_dynamic) {
      quant.dynamic = true;
    } else {
      quant.scale = 0.1f;  // step 0: static, input_scale[0], input_offset[0] = 0
    }
    unsmoothed = quant;
    quant.smooth = &factors;
    const auto expected = [&](const RefQuant& q) {
      return algo == QuantAlgo::w8a8_static ? expected_y(q, {0.01f, 0.02f}, {3, -4}, true)
                                            : expected_y(q, {0.1f, 0.2f}, {0, 0});
    };
    expect_near(y, expected(quant));
    // The factors matter for these inputs: without them the output is far off.
    const EpilogueRef without = expected(unsmoothed);
    double largest_miss = 0;
    for (std::size_t i = 0; i < y.size(); ++i) {
      largest_miss = std::max(largest_miss, std::fabs(y[i] - without.expected[i]) /
                                                (std::fabs(without.expected[i]) + 1e-3));
    }
    EXPECT_GT(largest_miss, 0.1);
  }
}

TEST(QuantModelLayers, FloatLayerFoldsKeptSmoothingFactors) {
  // A layer left in floating point after smoothing keeps the wrapper: y = (x · m) · Wᵀ + b.
  const std::vector<float> weight = {0.5f, -1.f, 2.f, 0.25f, 1.5f, -0.75f};
  const std::vector<float> factors = {2.f, 0.5f, 4.f};  // powers of two: the fold is exact
  for (const char* dtype : {"F32", "BF16"}) {
    SCOPED_TRACE(dtype);
    const TempDir dir("ditops_quant_model");
    HandModel hand(QuantAlgo::w8a8_dynamic);
    std::vector<std::uint16_t> half;
    for (const float value : weight) half.push_back(bf16::from_float(value).bits);
    hand.add_tensor("proj_out.linear.weight", dtype, {2, 3},
                    std::string(dtype) == "F32" ? bytes_of(weight) : bytes_of(half));
    hand.add_tensor("proj_out.linear.bias", "F32", {2}, bytes_of(kBias));
    hand.add_tensor("proj_out.div.mul_scale", "F32", {3}, bytes_of(factors));
    hand.description["proj_out.linear.weight"] = "FLOAT";
    hand.description["proj_out.div.mul_scale"] = "FLOAT";
    const QuantModel model = QuantModel::load(hand.write(dir));
    std::vector<float> smoothed_x = kX;
    for (std::size_t i = 0; i < kX.size(); ++i) smoothed_x[i] *= factors[i % 3];
    const std::vector<double> expected = float_matmul_ref(smoothed_x, weight, kBias, 2, 2, 3);
    const std::vector<float> y = run(model.linear("proj_out"));
    for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-5) << i;
  }
}

TEST(QuantModelLayers, DeqScaleAsInt64BitsOrF32IsOneLayer) {
  const TempDir bits_dir("ditops_quant_model"), f32_dir("ditops_quant_model");
  HandModel as_f32(QuantAlgo::w8a8_static);
  as_f32.add(".deq_scale", "F32", {2}, bytes_of(std::vector<float>{0.01f, 0.02f}));
  const QuantModel bits = QuantModel::load(HandModel(QuantAlgo::w8a8_static).write(bits_dir));
  const QuantModel f32 = QuantModel::load(as_f32.write(f32_dir));
  EXPECT_EQ(run(bits.linear("blocks.0.attn.to_q")), run(f32.linear("blocks.0.attn.to_q")));
}

TEST(QuantModelLayers, MisalignedTensorsGiveTheSameLayer) {
  for (const QuantAlgo algo :
       {QuantAlgo::w8a8_static, QuantAlgo::w8a8_dynamic, QuantAlgo::w8a8_timestep}) {
    SCOPED_TRACE(quant_algo_name(algo));
    const TempDir aligned_dir("ditops_quant_model"), unaligned_dir("ditops_quant_model");
    HandModel hand(algo);
    hand.add(".div.mul_scale", "F32", {3}, bytes_of(std::vector<float>{1.5f, 0.5f, 2.f}));
    const QuantModel aligned = QuantModel::load(hand.write(aligned_dir));
    const QuantModel unaligned = QuantModel::load(hand.write_unaligned(unaligned_dir));
    EXPECT_EQ(run(aligned.linear("blocks.0.attn.to_q")),
              run(unaligned.linear("blocks.0.attn.to_q")));
  }
}

TEST(QuantModelLayers, FloatLayersWidenF16AndKeepBf16) {
  const std::vector<float> weight = {0.5f, -1.f, 2.f, 0.25f, 1.5f, -0.75f};  // exact in f16, bf16
  for (const char* dtype : {"F32", "F16", "BF16"}) {
    SCOPED_TRACE(dtype);
    const TempDir dir("ditops_quant_model");
    HandModel hand(QuantAlgo::w8a8_dynamic);
    std::vector<std::uint16_t> half;
    for (const float value : weight) {
      half.push_back(std::string(dtype) == "F16" ? f16::from_float(value).bits
                                                 : bf16::from_float(value).bits);
    }
    hand.add_tensor("proj_out.weight", dtype, {2, 3},
                    std::string(dtype) == "F32" ? bytes_of(weight) : bytes_of(half));
    hand.add_tensor("proj_out.bias", "F16", {2},
                    bytes_of(std::vector<std::uint16_t>{f16::from_float(0.5f).bits,
                                                        f16::from_float(-0.5f).bits}));
    hand.description["proj_out.weight"] = "FLOAT";
    const QuantModel model = QuantModel::load(hand.write(dir));
    const QuantLinear layer = model.linear("proj_out");
    EXPECT_EQ(layer.algo(), QuantAlgo::float_linear);
    const std::vector<double> expected = float_matmul_ref(kX, weight, kBias, 2, 2, 3);
    const std::vector<float> y = run(layer);
    for (std::size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], expected[i], 1e-5) << i;
  }
  // The FLOAT norm is no linear layer: refused when asked for, naming it.
  const TempDir dir("ditops_quant_model");
  const QuantModel model = QuantModel::load(HandModel(QuantAlgo::w8a8_dynamic).write(dir));
  try {
    model.linear("norm");
    ADD_FAILURE();
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what())
                  .find("QuantModel::linear: layer \"norm\" (FLOAT): tensor \"norm.weight\""),
              std::string::npos)
        << error.what();
  }
}

/// `read` throws an Error whose message holds every needle.
template <class Read>
void expect_error(Read&& read, const std::vector<std::string>& needles) {
  try {
    read();
    ADD_FAILURE() << "no Error";
  } catch (const Error& error) {
    const std::string message = error.what();
    for (const std::string& needle : needles) {
      EXPECT_NE(message.find(needle), std::string::npos) << "'" << message << "' lacks " << needle;
    }
  }
}

TEST(QuantModel, FloatTensorsWidenToF32) {
  const std::vector<float> values = {0.5f, -1.f, 2.f, 0.25f};  // exact in f16 and bf16
  std::vector<std::uint16_t> as_f16, as_bf16;
  for (const float value : values) {
    as_f16.push_back(f16::from_float(value).bits);
    as_bf16.push_back(bf16::from_float(value).bits);
  }
  const TempDir dir("ditops_quant_model");
  HandModel hand(QuantAlgo::w8a8_dynamic);
  hand.add_tensor("norm_f16.weight", "F16", {2, 2}, bytes_of(as_f16));
  hand.add_tensor("norm_bf16.weight", "BF16", {4}, bytes_of(as_bf16));
  const QuantModel model = QuantModel::load(hand.write(dir));
  EXPECT_EQ(model.float_tensor("norm.weight"), (std::vector<float>{1, 1, 1}));
  EXPECT_EQ(model.float_tensor("norm_f16.weight"), values);
  EXPECT_EQ(model.float_tensor("norm_bf16.weight"), values);

  const std::string weights = dir / loader::weight_file_name(QuantAlgo::w8a8_dynamic, -1);
  expect_error([&] { model.float_tensor("norm_q.weight"); },
               {"QuantModel::float_tensor", "\"norm_q.weight\"", weights});
  // A quantized layer's int8 weight is no floating-point tensor.
  expect_error([&] { model.float_tensor("blocks.0.attn.to_q.weight"); },
               {"QuantModel::float_tensor", "\"blocks.0.attn.to_q.weight\"", weights,
                "dtype I8, expected F32, F16 or BF16"});
}

}  // namespace
}  // namespace ditops::test
