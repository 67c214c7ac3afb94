// ditops-quantize: post-training W8A8 quantization of the linear layers in a safetensors file,
// written as msmodelslim's file pair (quant_model_description_{algo}.json and
// quant_model_weight_{algo}.safetensors) that QuantModel::load and MindIE-SD read.
//
//   ditops-quantize --weights FILE --out DIR [--algo W8A8|W8A8_DYNAMIC|W8A8_TIMESTEP]
//                   [--calibration FILE] [--float PATTERN]... [--smooth ALPHA] [--rank N]
//
// Bad arguments: one line on stderr and exit 2; a file that cannot be read or written: exit 1.

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ditops/tensor.hpp>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "loader/quant_files.hpp"
#include "loader/quantize.hpp"

namespace {

const char* kUsage =
    "usage: ditops-quantize --weights FILE --out DIR [--algo W8A8|W8A8_DYNAMIC|W8A8_TIMESTEP] "
    "[--calibration FILE] [--float PATTERN]... [--smooth ALPHA] [--rank N]";

const char* kHelp = R"(
Quantizes every linear layer of a safetensors file (tensors <layer>.weight [out, in], F32, F16
or BF16, and optional <layer>.bias [out]) to int8 weights, per output channel, and writes
  DIR/quant_model_description_{algo}[_{rank}].json
  DIR/quant_model_weight_{algo}[_{rank}].safetensors
with msmodelslim's tensor names. Other tensors are copied unchanged and described as FLOAT.

  --weights FILE      the floating-point model
  --out DIR           an existing directory; files of the same names in it are replaced
  --algo ALGO         W8A8 (static activations, the default), W8A8_DYNAMIC (per token) or
                      W8A8_TIMESTEP (static per denoising step, dynamic after the last)
  --calibration FILE  safetensors with, per layer, <layer>.input [rows, in] activations or
                      <layer>.input_range [steps, 2, in] (each channel's max, then min, per
                      step): required for W8A8, W8A8_TIMESTEP and --smooth
  --float PATTERN     keep layers whose name matches the shell pattern in floating point
                      (repeatable), e.g. --float 'blocks.*.ff.net.2'
  --smooth ALPHA      SmoothQuant with migration strength ALPHA in [0, 1] (e.g. 0.5)
  --rank N            a multi-card export's card index (the _N file-name suffix)
)";

struct UsageError {
  std::string message;
};

[[noreturn]] void usage_error(const std::string& message) { throw UsageError{message}; }

struct Arguments {
  std::string weights, calibration, out;
  ditops::QuantizeOptions options;
};

Arguments parse(int argc, char** argv) {
  Arguments args;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::cout << kUsage << "\n" << kHelp;
      std::exit(0);
    }
    if (i + 1 >= argc)
      usage_error(flag.rfind("--", 0) == 0 && flag.size() > 2
                      ? flag + " needs a value"
                      : "unexpected argument '" + flag + "'");
    const std::string value = argv[++i];
    if (flag == "--weights") {
      args.weights = value;
    } else if (flag == "--calibration") {
      args.calibration = value;
    } else if (flag == "--out") {
      args.out = value;
    } else if (flag == "--float") {
      args.options.float_patterns.push_back(value);
    } else if (flag == "--algo") {
      const auto algo = ditops::loader::quant_algo_from_name(value);
      if (!algo || *algo == ditops::QuantAlgo::float_linear) {
        usage_error("--algo '" + value + "' is not W8A8, W8A8_DYNAMIC or W8A8_TIMESTEP");
      }
      args.options.algo = *algo;
    } else if (flag == "--smooth") {
      char* end = nullptr;
      errno = 0;
      const double alpha = std::strtod(value.c_str(), &end);
      if (value.empty() || end != value.c_str() + value.size() || errno != 0 ||
          !(alpha >= 0 && alpha <= 1)) {
        usage_error("--smooth '" + value + "' is not a number in [0, 1]");
      }
      args.options.smooth_alpha = static_cast<float>(alpha);
    } else if (flag == "--rank") {
      int rank = -1;
      const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), rank);
      if (error != std::errc() || end != value.data() + value.size() || rank < 0) {
        usage_error("--rank '" + value + "' is not a non-negative integer");
      }
      args.options.rank = rank;
    } else {
      usage_error("unknown flag '" + flag + "'");
    }
  }
  if (args.weights.empty()) usage_error("--weights is required");
  if (args.out.empty()) usage_error("--out is required");
  if (args.calibration.empty() && args.options.algo != ditops::QuantAlgo::w8a8_dynamic) {
    usage_error("--algo " + std::string(ditops::quant_algo_name(args.options.algo)) +
                " needs --calibration (or use --algo W8A8_DYNAMIC)");
  }
  if (args.calibration.empty() && args.options.smooth_alpha) {
    usage_error("--smooth needs --calibration (the activations' per-channel ranges)");
  }
  return args;
}

}  // namespace

int main(int argc, char** argv) {
  Arguments args;
  try {
    args = parse(argc, argv);
  } catch (const UsageError& error) {
    std::cerr << "ditops-quantize: " << error.message << " (--help for usage)\n";
    return 2;
  }
  try {
    std::error_code error;
    if (!std::filesystem::is_directory(args.out, error)) {
      std::cerr << "ditops-quantize: --out " << args.out << " is not an existing directory\n";
      return 1;
    }
    const auto weights = ditops::loader::SafetensorsFile::open(args.weights);
    std::optional<ditops::loader::SafetensorsFile> calibration;
    if (!args.calibration.empty()) {
      calibration = ditops::loader::SafetensorsFile::open(args.calibration);
    }
    const auto report = ditops::loader::quantize_model(
        weights, calibration ? &*calibration : nullptr, args.out, args.options);
    std::cout << "quantized " << report.quantized_layers.size() << " layer(s), kept "
              << report.float_layers.size() << " in floating point\n"
              << "  " << report.description_path << "\n  " << report.weights_path << "\n";
  } catch (const ditops::Error& error) {
    std::cerr << "ditops-quantize: " << error.what() << "\n";
    return 1;
  }
  return 0;
}
