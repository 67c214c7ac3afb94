// dit_block: times one DiT block (dit_block.hpp) under classifier-free guidance, fused (one
// batch of two) and as two passes, per operator, and optionally on two instances at once.
//
//   dit_block [--hidden 3072] [--heads 24] [--image 4608] [--text 512] [--mlp-ratio 4]
//             [--frames 1] [--stream single|double] [--attention flash|int8|rainfusion]
//             [--linear w8a8|fp32] [--cfg fused|two-pass|both] [--instances 1|2] [--steps N]
//             [--threads N] [--warmup N] [--seed N] [--compare] [--json]
//             [--weights DESCRIPTION.json | --save-weights FILE] [--prefix PREFIX]
//
// --stream: FLUX's double-stream block (separate text and image weights, joint attention; the
// default) or its single-stream one (one set of weights).
//
// Weights are synthetic, drawn from --seed, unless --weights names a quantized model's
// description JSON (msmodelslim's, or ditops-quantize's): the shape still comes from the flags,
// the layers from the model, by diffusers' FLUX names under PREFIX (default
// "transformer_blocks.0." or "single_transformer_blocks.0."; dit_block.hpp lists them), each in
// the algorithm the model gives it (--linear is not used). --save-weights writes the synthetic
// weights (the fp32 draw of --seed) as a safetensors checkpoint under those names and exits:
//   dit_block --hidden 256 --heads 4 --save-weights block.safetensors
//   ditops-quantize --weights block.safetensors --out model --algo W8A8_DYNAMIC
//   dit_block --hidden 256 --heads 4 --weights model/quant_model_description_w8a8_dynamic.json
// runs the W8A8 block of the same seed, bit for bit.
//
// --json prints the report as JSON on stdout and the text report on stderr. --warmup: untimed
// CFG blocks before each measurement (plans, first-touch page faults; default 1). --compare
// also times the block with each other attention and linear kind at the same shape (fused CFG)
// and prints them in one table. Memory is the process's resident set (Linux /proc/self/statm):
// after the weights are packed, while one instance runs, and while two do.

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ditops/instance.hpp>
#include <ditops/quant_model.hpp>
#include <ditops/runtime.hpp>
#include <exception>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dit_block.hpp"

namespace {

struct Options {
  dit::DitBlockConfig config;
  std::string cfg = "both";
  int instances = 1;
  int steps = 1;
  int warmup = 1;
  int threads = 0;
  bool compare = false;
  bool json = false;
  std::string weights;       ///< --weights: a model's description JSON; empty: synthetic weights
  std::string save_weights;  ///< --save-weights: write the synthetic weights there and exit
  std::string prefix;        ///< --prefix; empty: dit::default_layer_prefix(config.stream)
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "dit_block: %s\nusage: dit_block [--hidden N] [--heads N] [--image N] [--text N]"
               " [--mlp-ratio N] [--frames N] [--stream single|double]"
               " [--attention flash|int8|rainfusion]"
               " [--linear w8a8|fp32] [--cfg fused|two-pass|both] [--instances 1|2]"
               " [--steps N] [--warmup N] [--threads N] [--seed N] [--compare] [--json]"
               " [--weights DESCRIPTION.json | --save-weights FILE] [--prefix PREFIX]\n",
               problem.c_str());
  std::exit(2);
}

long long parse_int(const std::string& flag, const char* text, long long low) {
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (*text == '\0' || *end != '\0' || value < low) {
    usage(flag + " needs an integer >= " + std::to_string(low));
  }
  return value;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--json" || flag == "--compare") {
      (flag == "--json" ? o.json : o.compare) = true;
      continue;
    }
    if (i + 1 >= argc) usage(flag + " needs a value (or is unknown)");
    const char* value = argv[++i];
    const std::string text = value;
    if (flag == "--hidden") {
      o.config.hidden = parse_int(flag, value, 1);
    } else if (flag == "--heads") {
      o.config.heads = parse_int(flag, value, 1);
    } else if (flag == "--image") {
      o.config.image_tokens = parse_int(flag, value, 1);
    } else if (flag == "--text") {
      o.config.text_tokens = parse_int(flag, value, 1);
    } else if (flag == "--mlp-ratio") {
      o.config.mlp_ratio = parse_int(flag, value, 1);
    } else if (flag == "--frames") {
      o.config.frames = parse_int(flag, value, 1);
    } else if (flag == "--steps") {
      o.steps = static_cast<int>(parse_int(flag, value, 1));
    } else if (flag == "--warmup") {
      o.warmup = static_cast<int>(parse_int(flag, value, 0));
    } else if (flag == "--threads") {
      o.threads = static_cast<int>(parse_int(flag, value, 0));
    } else if (flag == "--seed") {
      o.config.seed = static_cast<std::uint32_t>(parse_int(flag, value, 0));
    } else if (flag == "--instances") {
      o.instances = static_cast<int>(parse_int(flag, value, 1));
      if (o.instances > 2) usage("--instances is 1 or 2");
    } else if (flag == "--stream") {
      if (text != "double" && text != "single") usage("--stream is single or double");
      o.config.stream =
          text == "double" ? dit::StreamKind::double_stream : dit::StreamKind::single_stream;
    } else if (flag == "--attention") {
      if (text == "flash") {
        o.config.attention = dit::AttentionKind::flash;
      } else if (text == "int8") {
        o.config.attention = dit::AttentionKind::int8;
      } else if (text == "rainfusion") {
        o.config.attention = dit::AttentionKind::rainfusion;
      } else {
        usage("--attention is flash, int8 or rainfusion");
      }
    } else if (flag == "--linear") {
      if (text != "w8a8" && text != "fp32") usage("--linear is w8a8 or fp32");
      o.config.linear = text == "w8a8" ? dit::LinearKind::w8a8 : dit::LinearKind::fp32;
    } else if (flag == "--cfg") {
      if (text != "fused" && text != "two-pass" && text != "both") {
        usage("--cfg is fused, two-pass or both");
      }
      o.cfg = text;
    } else if (flag == "--weights") {
      o.weights = text;
    } else if (flag == "--save-weights") {
      o.save_weights = text;
    } else if (flag == "--prefix") {
      o.prefix = text;
    } else {
      usage("unknown argument " + flag);
    }
  }
  o.config.head_dim = o.config.hidden / o.config.heads;
  if (o.prefix.empty()) o.prefix = dit::default_layer_prefix(o.config.stream);
  if (!o.weights.empty() && !o.save_weights.empty()) {
    usage("--weights reads a model, --save-weights writes the synthetic one: give one of them");
  }
  if (!o.weights.empty() && o.compare) {
    usage("--compare varies the synthetic weights' linear kind: it does not take --weights");
  }
  return o;
}

constexpr float kGuidanceScale = 3.5f;

/// The two prompts' inputs: the unconditional (negative, usually empty) prompt uses a quarter
/// of the text tokens, so the batch needs its padding mask.
dit::CfgInput random_cfg_input(const dit::DitBlockConfig& config, std::uint32_t seed) {
  return dit::random_cfg_input(config, seed, std::max<std::int64_t>(1, config.text_tokens / 4));
}

/// The process's resident memory in bytes (0 where /proc/self/statm cannot be read).
std::int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t pages = 0, resident_pages = 0;
  if (!(statm >> pages >> resident_pages)) return 0;
  return resident_pages * static_cast<std::int64_t>(sysconf(_SC_PAGESIZE));
}

double megabytes(std::int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

struct Measurement {
  double seconds_per_block = 0;  ///< one CFG block: both prompts through the block, combined
  dit::OpTimes times;            ///< summed over the timed steps
  std::int64_t resident = 0;     ///< after the run: weights plus this run's activations
};

/// `warmup` untimed blocks (plans, first-touch page faults), then `steps` timed ones.
Measurement measure(const dit::DitBlock& block, dit::CfgMode mode, const Options& o) {
  dit::CfgInput input = random_cfg_input(block.config(), o.config.seed + 1);
  std::vector<float> guided(input.x.size() / 2);
  dit::DitWorkspace workspace;
  if (o.warmup > 0) {
    dit::run_cfg(block, o.warmup, mode, kGuidanceScale, input.x, input.conditioning,
                 input.text_lengths, guided, nullptr, &workspace);
  }
  Measurement m;
  const auto start = std::chrono::steady_clock::now();
  dit::run_cfg(block, o.steps, mode, kGuidanceScale, input.x, input.conditioning,
               input.text_lengths, guided, &m.times, &workspace);
  m.seconds_per_block =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / o.steps;
  m.resident = resident_bytes();  // the workspace still held
  return m;
}

struct Throughput {
  double blocks_per_second = 0;
  std::int64_t resident = 0;  ///< after the run: the weights once, every instance's activations
};

/// --instances N: the machine split into N instances; one of them running alone, then all.
struct InstanceRuns {
  int cores_each = 0;
  Throughput one, all;
};

/// Blocks per second of the first `count` of `instances` (a partition of the machine), each
/// running `steps` CFG blocks on its own input from its own run(), concurrently. The weights are
/// shared (a copy of a DitBlock shares its packed layers).
Throughput instance_throughput(const dit::DitBlock& block,
                               const std::vector<ditops::Instance>& instances, int count,
                               const Options& o) {
  std::vector<dit::CfgInput> inputs;
  std::vector<dit::DitWorkspace> workspaces(static_cast<std::size_t>(count));
  for (int i = 0; i < count; ++i) {
    inputs.push_back(
        random_cfg_input(block.config(), o.config.seed + 10 + static_cast<unsigned>(i)));
  }
  const auto run_all = [&](int steps) {
    std::vector<std::thread> drivers;
    std::vector<std::exception_ptr> errors(static_cast<std::size_t>(count));
    for (int i = 0; i < count; ++i) {
      drivers.emplace_back([&, i] {
        try {
          const auto at = static_cast<std::size_t>(i);
          dit::CfgInput& in = inputs[at];
          std::vector<float> guided(in.x.size() / 2);
          instances[at].run([&] {
            dit::run_cfg(block, steps, dit::CfgMode::fused, kGuidanceScale, in.x, in.conditioning,
                         in.text_lengths, guided, nullptr, &workspaces[at]);
          });
        } catch (...) {
          errors[static_cast<std::size_t>(i)] = std::current_exception();
        }
      });
    }
    for (auto& driver : drivers) driver.join();
    for (auto& error : errors) {
      if (error) std::rethrow_exception(error);
    }
  };
  if (o.warmup > 0) run_all(o.warmup);  // as in measure()
  Throughput result;
  const auto start = std::chrono::steady_clock::now();
  run_all(o.steps);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.resident = resident_bytes();  // every instance's workspace still held
  result.blocks_per_second = count * o.steps / seconds;
  return result;
}

/// One fused CFG block of another attention and linear kind at the same shape (--compare).
struct Variant {
  dit::AttentionKind attention;
  dit::LinearKind linear;
  double seconds_per_block;
};

dit::DitBlock make_block(const dit::DitBlockConfig& config) {
  // The fp32 copies of the weights are only needed to build the layers.
  const dit::DitBlockWeights weights = dit::make_synthetic_weights(config);
  return dit::DitBlock(config, weights);
}

/// The block the CLI runs, and the algorithm of its linear layers as the report names it: the
/// synthetic weights of the config, or the layers of the --weights model.
struct Block {
  dit::DitBlock block;
  std::string linears;
};

Block build_block(const Options& o) {
  if (o.weights.empty()) return {make_block(o.config), dit::linear_kind_name(o.config.linear)};
  // The layers pack their own copies: the model's mapping may go once the block is built.
  const ditops::QuantModel model = ditops::QuantModel::load(o.weights);
  return {dit::DitBlock(o.config, model, o.prefix), ditops::quant_algo_name(model.model_algo())};
}

/// --save-weights: the fp32 draw of the seed, so that ditops-quantize --algo W8A8_DYNAMIC
/// reproduces the synthetic W8A8 layers exactly (dit::write_weights).
void save_weights(const Options& o) {
  dit::DitBlockConfig config = o.config;
  config.linear = dit::LinearKind::fp32;
  dit::write_weights(o.save_weights, config, dit::make_synthetic_weights(config), o.prefix);
  std::printf("wrote the %s-stream block's fp32 weights (seed %u) under \"%s\" to %s\n",
              dit::stream_kind_name(config.stream), config.seed, o.prefix.c_str(),
              o.save_weights.c_str());
}

std::vector<Variant> compare_variants(const Options& o) {
  std::vector<Variant> variants;
  for (dit::AttentionKind attention :
       {dit::AttentionKind::flash, dit::AttentionKind::int8, dit::AttentionKind::rainfusion}) {
    for (dit::LinearKind linear : {dit::LinearKind::w8a8, dit::LinearKind::fp32}) {
      Options variant = o;
      variant.config.attention = attention;
      variant.config.linear = linear;
      const double seconds =
          measure(make_block(variant.config), dit::CfgMode::fused, variant).seconds_per_block;
      variants.push_back({attention, linear, seconds});
    }
  }
  return variants;
}

struct Report {
  std::string linears;                    ///< the linear layers' algorithm (Block::linears)
  const Measurement* fused = nullptr;     ///< null unless --cfg fused or both
  const Measurement* two_pass = nullptr;  ///< null unless --cfg two-pass or both
  const Measurement* shown = nullptr;     ///< whose operator shares are printed
  std::int64_t resident_weights = 0;      ///< resident set after packing the weights
  InstanceRuns instances;                 ///< --instances 2 only
  std::vector<Variant> variants;          ///< --compare only
};

void print_text(std::FILE* file, const Options& o, const Report& r) {
  const dit::DitBlockConfig& c = o.config;
  std::fprintf(file,
               "DiT block (%s-stream): hidden %lld, %lld heads x %lld, image %lld + text %lld"
               " tokens, mlp x%lld, %s linears, %s attention, %d threads, %s\n",
               dit::stream_kind_name(c.stream), static_cast<long long>(c.hidden),
               static_cast<long long>(c.heads), static_cast<long long>(c.head_dim),
               static_cast<long long>(c.image_tokens), static_cast<long long>(c.text_tokens),
               static_cast<long long>(c.mlp_ratio), r.linears.c_str(),
               dit::attention_kind_name(c.attention), ditops::num_threads(),
               ditops::cpu_info().isa.c_str());
  if (o.weights.empty()) {
    std::fprintf(file, "weights: synthetic (seed %u)\n", c.seed);
  } else {
    std::fprintf(file, "weights: %s, layers under \"%s\"\n", o.weights.c_str(), o.prefix.c_str());
  }
  if (r.fused) {
    std::fprintf(file, "CFG fused (batch 2):     %.4f s per block\n", r.fused->seconds_per_block);
  }
  if (r.two_pass) {
    std::fprintf(file, "CFG two passes (batch 1): %.4f s per block\n",
                 r.two_pass->seconds_per_block);
  }
  if (r.fused && r.two_pass) {
    std::fprintf(file, "two-pass / fused: %.3f\n",
                 r.two_pass->seconds_per_block / r.fused->seconds_per_block);
  }
  const Measurement& shown = *r.shown;
  const double total = shown.times.total();
  std::fprintf(file, "operator shares (%s):\n", r.fused == r.shown ? "fused" : "two passes");
  for (const auto& [name, seconds] : shown.times.entries()) {
    std::fprintf(file, "  %-14s %8.4f s/block %6.1f%%\n", name.c_str(), seconds / o.steps,
                 100.0 * seconds / total);
  }
  std::fprintf(file, "  (outside the timers: %.4f s/block)\n",
               shown.seconds_per_block - total / o.steps);
  std::fprintf(file, "resident memory: %.1f MB with the weights packed, %.1f MB running\n",
               megabytes(r.resident_weights), megabytes(shown.resident));
  if (o.instances > 1) {
    const InstanceRuns& i = r.instances;
    std::fprintf(file,
                 "instances of %d core(s): 1 alone %.4f blocks/s, %d at once %.4f blocks/s"
                 " (%.3fx); resident %.1f MB with 1, %.1f MB with %d (%.3fx)\n",
                 i.cores_each, i.one.blocks_per_second, o.instances, i.all.blocks_per_second,
                 i.all.blocks_per_second / i.one.blocks_per_second, megabytes(i.one.resident),
                 megabytes(i.all.resident), o.instances,
                 static_cast<double>(i.all.resident) / static_cast<double>(i.one.resident));
  }
  if (!r.variants.empty()) {
    std::fprintf(file,
                 "\nseconds per fused CFG block by attention and linears (x: time / this "
                 "block's fused time):\n\n| attention | w8a8 linears | fp32 linears |\n"
                 "|---|---:|---:|\n");
    for (std::size_t i = 0; i + 1 < r.variants.size(); i += 2) {
      const Variant &w8a8 = r.variants[i], &fp32 = r.variants[i + 1];
      std::fprintf(file, "| %s | %.4f s (%.2fx) | %.4f s (%.2fx) |\n",
                   dit::attention_kind_name(w8a8.attention), w8a8.seconds_per_block,
                   w8a8.seconds_per_block / shown.seconds_per_block, fp32.seconds_per_block,
                   fp32.seconds_per_block / shown.seconds_per_block);
    }
  }
}

void print_json(const Options& o, const Report& r) {
  const dit::DitBlockConfig& c = o.config;
  std::printf(
      "{\n  \"block\": \"%s-stream\", \"hidden\": %lld, \"heads\": %lld,"
      " \"head_dim\": %lld, \"image_tokens\": %lld, \"text_tokens\": %lld,"
      " \"mlp_ratio\": %lld,\n  \"linear\": \"%s\", \"weights\": \"%s\", \"attention\": \"%s\","
      " \"threads\": %d, \"isa\": \"%s\", \"steps\": %d,\n",
      dit::stream_kind_name(c.stream), static_cast<long long>(c.hidden),
      static_cast<long long>(c.heads), static_cast<long long>(c.head_dim),
      static_cast<long long>(c.image_tokens), static_cast<long long>(c.text_tokens),
      static_cast<long long>(c.mlp_ratio), r.linears.c_str(),
      o.weights.empty() ? "synthetic" : "file", dit::attention_kind_name(c.attention),
      ditops::num_threads(), ditops::cpu_info().isa.c_str(), o.steps);
  if (r.fused) std::printf("  \"fused_seconds_per_block\": %.6f,\n", r.fused->seconds_per_block);
  if (r.two_pass) {
    std::printf("  \"two_pass_seconds_per_block\": %.6f,\n", r.two_pass->seconds_per_block);
  }
  if (r.fused && r.two_pass) {
    std::printf("  \"two_pass_over_fused\": %.4f,\n",
                r.two_pass->seconds_per_block / r.fused->seconds_per_block);
  }
  const Measurement& shown = *r.shown;
  std::printf("  \"resident_bytes_weights\": %lld, \"resident_bytes_running\": %lld,\n",
              static_cast<long long>(r.resident_weights), static_cast<long long>(shown.resident));
  if (o.instances > 1) {
    const InstanceRuns& i = r.instances;
    std::printf(
        "  \"instances\": %d, \"cores_per_instance\": %d,"
        " \"blocks_per_second_1_instance\": %.6f, \"blocks_per_second_instances\": %.6f,\n"
        "  \"resident_bytes_1_instance\": %lld, \"resident_bytes_instances\": %lld,\n",
        o.instances, i.cores_each, i.one.blocks_per_second, i.all.blocks_per_second,
        static_cast<long long>(i.one.resident), static_cast<long long>(i.all.resident));
  }
  if (!r.variants.empty()) {
    std::printf("  \"variants\": [");
    const char* separator = "";
    for (const Variant& v : r.variants) {
      std::printf(
          "%s\n    {\"attention\": \"%s\", \"linear\": \"%s\", \"seconds_per_block\": %.6f}",
          separator, dit::attention_kind_name(v.attention), dit::linear_kind_name(v.linear),
          v.seconds_per_block);
      separator = ",";
    }
    std::printf("\n  ],\n");
  }
  const double total = shown.times.total();
  std::printf(
      "  \"operators_of\": \"%s\", \"untimed_seconds_per_block\": %.6f,\n"
      "  \"operators\": [",
      r.fused == r.shown ? "fused" : "two-pass", shown.seconds_per_block - total / o.steps);
  const char* separator = "";
  for (const auto& [name, seconds] : shown.times.entries()) {
    std::printf("%s\n    {\"name\": \"%s\", \"seconds_per_block\": %.6f, \"share\": %.4f}",
                separator, name.c_str(), seconds / o.steps, seconds / total);
    separator = ",";
  }
  std::printf("\n  ]\n}\n");
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  try {
    ditops::set_num_threads(o.threads);
    if (!o.save_weights.empty()) {
      save_weights(o);
      return 0;
    }
    const Block built = build_block(o);
    const dit::DitBlock& block = built.block;
    Report report;
    report.linears = built.linears;
    report.resident_weights = resident_bytes();
    Measurement fused, two_pass;
    if (o.cfg != "two-pass") {
      fused = measure(block, dit::CfgMode::fused, o);
      report.fused = &fused;
    }
    if (o.cfg != "fused") {
      two_pass = measure(block, dit::CfgMode::two_pass, o);
      report.two_pass = &two_pass;
    }
    report.shown = report.fused ? report.fused : report.two_pass;
    if (o.instances > 1) {
      const std::vector<ditops::Instance> instances = ditops::Instance::partition(o.instances);
      report.instances.cores_each = static_cast<int>(instances[0].cores().size());
      report.instances.one = instance_throughput(block, instances, 1, o);
      report.instances.all = instance_throughput(block, instances, o.instances, o);
    }
    if (o.compare) report.variants = compare_variants(o);
    print_text(o.json ? stderr : stdout, o, report);
    if (o.json) print_json(o, report);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dit_block: %s\n", e.what());
    return 1;
  }
  return 0;
}
