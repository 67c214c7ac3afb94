// dit_block: times one DiT block (dit_block.hpp) under classifier-free guidance, fused (one
// batch of two) and as two passes, per operator, and optionally on two instances at once.
//
//   dit_block [--hidden 3072] [--heads 24] [--image 4608] [--text 512] [--mlp-ratio 4]
//             [--frames 1] [--stream single|double] [--attention flash|int8|rainfusion]
//             [--linear w8a8|fp32] [--cfg fused|two-pass|both] [--instances 1|2] [--steps N]
//             [--threads N] [--warmup N] [--seed N] [--json]
//
// --stream: FLUX's double-stream block (separate text and image weights, joint attention; the
// default) or its single-stream one (one set of weights).
//
// --json prints the report as JSON on stdout and the text report on stderr. --warmup: untimed
// CFG blocks before each measurement (plans, first-touch page faults; default 1).

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ditops/instance.hpp>
#include <ditops/runtime.hpp>
#include <exception>
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
  bool json = false;
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "dit_block: %s\nusage: dit_block [--hidden N] [--heads N] [--image N] [--text N]"
               " [--mlp-ratio N] [--frames N] [--stream single|double]"
               " [--attention flash|int8|rainfusion]"
               " [--linear w8a8|fp32] [--cfg fused|two-pass|both] [--instances 1|2]"
               " [--steps N] [--warmup N] [--threads N] [--seed N] [--json]\n",
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
    if (flag == "--json") {
      o.json = true;
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
    } else {
      usage("unknown argument " + flag);
    }
  }
  o.config.head_dim = o.config.hidden / o.config.heads;
  return o;
}

constexpr float kGuidanceScale = 3.5f;

/// The two prompts' inputs: the unconditional (negative, usually empty) prompt uses a quarter
/// of the text tokens, so the batch needs its padding mask.
dit::CfgInput random_cfg_input(const dit::DitBlockConfig& config, std::uint32_t seed) {
  return dit::random_cfg_input(config, seed, std::max<std::int64_t>(1, config.text_tokens / 4));
}

struct Measurement {
  double seconds_per_block = 0;  ///< one CFG block: both prompts through the block, combined
  dit::OpTimes times;            ///< summed over the timed steps
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
  return m;
}

/// Blocks per second with the machine split into `count` instances, each running `steps` CFG
/// blocks on its own input from its own run(), concurrently. The weights are shared (a copy of
/// a DitBlock shares its packed layers).
double instance_throughput(const dit::DitBlock& block, int count, const Options& o) {
  const std::vector<ditops::Instance> instances = ditops::Instance::partition(count);
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
  const auto start = std::chrono::steady_clock::now();
  run_all(o.steps);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return count * o.steps / seconds;
}

void print_text(std::FILE* file, const Options& o, const Measurement* fused,
                const Measurement* two_pass, const Measurement& shown,
                double instances_throughput) {
  const dit::DitBlockConfig& c = o.config;
  std::fprintf(file,
               "DiT block (%s-stream): hidden %lld, %lld heads x %lld, image %lld + text %lld"
               " tokens, mlp x%lld, %s linears, %s attention, %d threads, %s\n",
               dit::stream_kind_name(c.stream), static_cast<long long>(c.hidden),
               static_cast<long long>(c.heads), static_cast<long long>(c.head_dim),
               static_cast<long long>(c.image_tokens), static_cast<long long>(c.text_tokens),
               static_cast<long long>(c.mlp_ratio), dit::linear_kind_name(c.linear),
               dit::attention_kind_name(c.attention), ditops::num_threads(),
               ditops::cpu_info().isa.c_str());
  if (fused)
    std::fprintf(file, "CFG fused (batch 2):     %.4f s per block\n", fused->seconds_per_block);
  if (two_pass) {
    std::fprintf(file, "CFG two passes (batch 1): %.4f s per block\n", two_pass->seconds_per_block);
  }
  if (fused && two_pass) {
    std::fprintf(file, "two-pass / fused: %.3f\n",
                 two_pass->seconds_per_block / fused->seconds_per_block);
  }
  const double total = shown.times.total();
  std::fprintf(file, "operator shares (%s):\n", fused == &shown ? "fused" : "two passes");
  for (const auto& [name, seconds] : shown.times.entries()) {
    std::fprintf(file, "  %-14s %8.4f s/block %6.1f%%\n", name.c_str(), seconds / o.steps,
                 100.0 * seconds / total);
  }
  std::fprintf(file, "  (outside the timers: %.4f s/block)\n",
               shown.seconds_per_block - total / o.steps);
  if (o.instances > 1) {
    std::fprintf(file, "throughput: 1 instance %.4f blocks/s, %d instances %.4f blocks/s\n",
                 1.0 / shown.seconds_per_block, o.instances, instances_throughput);
  }
}

void print_json(const Options& o, const Measurement* fused, const Measurement* two_pass,
                const Measurement& shown, double instances_throughput) {
  const dit::DitBlockConfig& c = o.config;
  std::printf(
      "{\n  \"block\": \"%s-stream\", \"hidden\": %lld, \"heads\": %lld,"
      " \"head_dim\": %lld, \"image_tokens\": %lld, \"text_tokens\": %lld,"
      " \"mlp_ratio\": %lld,\n  \"linear\": \"%s\", \"attention\": \"%s\","
      " \"threads\": %d, \"isa\": \"%s\", \"steps\": %d,\n",
      dit::stream_kind_name(c.stream), static_cast<long long>(c.hidden),
      static_cast<long long>(c.heads), static_cast<long long>(c.head_dim),
      static_cast<long long>(c.image_tokens), static_cast<long long>(c.text_tokens),
      static_cast<long long>(c.mlp_ratio), dit::linear_kind_name(c.linear),
      dit::attention_kind_name(c.attention), ditops::num_threads(), ditops::cpu_info().isa.c_str(),
      o.steps);
  if (fused) std::printf("  \"fused_seconds_per_block\": %.6f,\n", fused->seconds_per_block);
  if (two_pass) {
    std::printf("  \"two_pass_seconds_per_block\": %.6f,\n", two_pass->seconds_per_block);
  }
  if (fused && two_pass) {
    std::printf("  \"two_pass_over_fused\": %.4f,\n",
                two_pass->seconds_per_block / fused->seconds_per_block);
  }
  if (o.instances > 1) {
    std::printf(
        "  \"instances\": %d, \"blocks_per_second_1_instance\": %.6f,"
        " \"blocks_per_second_instances\": %.6f,\n",
        o.instances, 1.0 / shown.seconds_per_block, instances_throughput);
  }
  const double total = shown.times.total();
  std::printf(
      "  \"operators_of\": \"%s\", \"untimed_seconds_per_block\": %.6f,\n"
      "  \"operators\": [",
      fused == &shown ? "fused" : "two-pass", shown.seconds_per_block - total / o.steps);
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
    const dit::DitBlock block = [&] {
      // The fp32 copies of the weights are only needed to build the layers.
      const dit::DitBlockWeights weights = dit::make_synthetic_weights(o.config);
      return dit::DitBlock(o.config, weights);
    }();
    Measurement fused, two_pass;
    const bool run_fused = o.cfg != "two-pass", run_two_pass = o.cfg != "fused";
    if (run_fused) fused = measure(block, dit::CfgMode::fused, o);
    if (run_two_pass) two_pass = measure(block, dit::CfgMode::two_pass, o);
    const Measurement& shown = run_fused ? fused : two_pass;
    const double throughput = o.instances > 1 ? instance_throughput(block, o.instances, o) : 0.0;
    const Measurement* fused_or_null = run_fused ? &fused : nullptr;
    const Measurement* two_pass_or_null = run_two_pass ? &two_pass : nullptr;
    print_text(o.json ? stderr : stdout, o, fused_or_null, two_pass_or_null, shown, throughput);
    if (o.json) print_json(o, fused_or_null, two_pass_or_null, shown, throughput);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dit_block: %s\n", e.what());
    return 1;
  }
  return 0;
}
