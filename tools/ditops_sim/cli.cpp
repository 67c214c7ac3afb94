// ditops-sim's command table, --help texts and argument parsing.

#include "tools/ditops_sim/cli.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "sim/error.hpp"
#include "sim/hw.hpp"
#include "sim/mla.hpp"

namespace ditops::tools::sim_cli {
namespace {

// ---- the commands and their flags
// ----------------------------------------------------------------

const FlagSpec kHwFlag{"--hw", "FILE.json", "",
                       "hardware parameters (a file `ditops-sim hw` wrote)"};
const FlagSpec kSetFlag{"--set", "NAME=VALUE[,...]", "",
                        "override hardware parameters (after --hw); names: ditops-sim hw"};
const FlagSpec kJsonFlag{"--json", nullptr, "", "print JSON instead of a table"};
const FlagSpec kMaxInstructionsFlag{"--max-instructions", "N", "30000000",
                                    "refuse a program estimated larger (~30 bytes each)"};
const FlagSpec kModeFlag{"--mode", "fine|coarse|auto", "auto",
                         "fine: every instruction; coarse: one event per (core, unit, stage); "
                         "auto: fine unless above --max-instructions"};
const FlagSpec kOptFlag{"--opt", "NAME[,NAME...]", "none",
                        "optimization switches, or all / none (sim/README.md lists them)"};
const FlagSpec kTraceFlag{"--trace", "FILE.json", "",
                          "Perfetto / Chrome trace of every instruction"};
const FlagSpec kCsvFlag{"--csv", "FILE.csv", "", "msprof-like PipeUtilization CSV"};
const FlagSpec kSvgFlag{"--svg", "FILE.svg", "", "Gantt chart of the pipes"};

// The flags of every command that builds and runs a program, and of those that draw it.
const std::vector<FlagSpec> kProgramFlags{kOptFlag, kHwFlag, kSetFlag, kMaxInstructionsFlag,
                                          kModeFlag};
const std::vector<FlagSpec> kDrawingFlags{kTraceFlag, kCsvFlag, kSvgFlag};
// The MLA problem beyond the (batch, kv) grid, shared by mla and sweep.
const std::vector<FlagSpec> kMlaShapeFlags{
    {"--heads", "N", "128", "query heads (one latent KV head)"},
    {"--q-len", "N", "1", "query tokens per sequence (MTP)"},
    {"--cores", "N", "24", "AI cores the kernel launches on (at most num_cores)"},
    {"--block-size", "64|128", "128", "paged KV block size"}};

// The groups of flags in order, as one list.
std::vector<FlagSpec> flags(std::initializer_list<std::vector<FlagSpec>> groups) {
  std::vector<FlagSpec> all;
  for (const std::vector<FlagSpec>& group : groups) {
    all.insert(all.end(), group.begin(), group.end());
  }
  return all;
}

const std::vector<CommandSpec>& commands() {
  static const std::vector<CommandSpec> table = {
      {"mla", "simulate the int8 MLA paged-decode kernel once and report where the time goes",
       flags({{{"--batch", "N", "1", "sequences"}, {"--kv", "N", "2048", "KV tokens per sequence"}},
              kMlaShapeFlags,
              {{"--chunk", "1|2|4", "2", "QK stages run ahead of their PVs (ops/schedule)"}},
              kProgramFlags,
              kDrawingFlags,
              {kJsonFlag}})},
      {"sweep", "simulate the MLA kernel over a (batch, kv, chunk) grid; ratios to chunk 1",
       flags({{{"--batch", "N[,N...]", "1,2,4,8,16,24,48", "sequences"},
               {"--kv", "N[,N...]", "512,2048,4096", "KV tokens per sequence"},
               {"--chunk", "C[,C...]", "1,2,4", "chunk sizes (1, 2 or 4)"}},
              kMlaShapeFlags,
              kProgramFlags,
              {{"--cpu", "BENCH.json", "",
                "put the CPU kernel's chunk ratios beside the simulator's (ditops_bench mla_grid "
                "--benchmark_out)"},
               {"--cpu-threads", "N", "2", "the CPU runs' thread count to compare (needs --cpu)"},
               kJsonFlag}})},
      {"fa",
       "simulate prefill flash attention (dense or block-sparse) once and report where the "
       "time goes",
       flags(
           {{{"--batch", "N", "1", "batch"},
             {"--heads", "N", "24", "attention heads"},
             {"--seq", "N", "4608", "query tokens (with --video: text + T x H x W)"},
             {"--kv-seq", "N", "SEQ", "key tokens"},
             {"--dim", "N", "128", "head dimension (a multiple of 16)"},
             {"--dtype", "bf16|int8", "bf16", "q, k, v and P element type"},
             {"--cores", "N", "24", "AI cores"},
             {"--chunk", "1|2|4", "2", "QK stages run ahead of their PVs (ops/schedule)"},
             {"--density", "D", "1.0", "uniform block sparsity: kept share of 128-token KV blocks"},
             {"--video", "T,H,W", "", "RainFusion layout: latent frames x height x width"},
             {"--text", "N", "0", "RainFusion text tokens (before the video)"},
             {"--sparsity", "S", "0.64", "RainFusion spatial/temporal sparsity in [0, 1)"},
             {"--pattern", "NAME[,NAME...]", "spatial,temporal,textural",
              "RainFusion pattern of head h: the list's entry h mod its length"}},
            kProgramFlags,
            kDrawingFlags,
            {kJsonFlag}})},
      {"calibrate",
       "fit hardware parameters to measured MLA or flash-attention times, speedups or ratios "
       "(sim/README.md: \"How to calibrate against msprof\")",
       {{"--measured", "FILE.csv", "",
         "measurements: batch,kv,chunk,opt[,heads,q_len,cores,block_size] and time_us, or "
         "speedup with base_chunk,base_opt; kernel=fa rows, includes_launch and series columns "
         "as sim/README.md describes (required)"},
        kHwFlag,
        kSetFlag,
        {"--fit", "NAME[,NAME...]", "every U-tagged parameter but kernel_launch_us",
         "parameters to fit, each within [1/4, 4] x its start"},
        {"--out", "FITTED.json", "", "write the fitted parameters as a --hw file"},
        kJsonFlag}},
      {"validate",
       "predict every published measurement set (sim/measurements) and show the errors of the "
       "ratios and trends, set by set (sim/README.md: \"How well it predicts\")",
       {{"--dir", "DIR", "sim/measurements of the source tree",
         "measurement sets: every *.csv in DIR (the calibrate format; \"# role:\" lines)"},
        kHwFlag,
        kSetFlag,
        kJsonFlag}},
      {"hw",
       "print the hardware parameters as JSON with units, sources and ranges (a valid --hw file)",
       {kHwFlag, kSetFlag}},
  };
  return table;
}

const CommandSpec* find_command(const std::string& name) {
  for (const CommandSpec& command : commands()) {
    if (name == command.name) return &command;
  }
  return nullptr;
}

std::string command_names() {
  std::string names;
  for (const CommandSpec& command : commands()) {
    names += (names.empty() ? "" : ", ") + std::string(command.name);
  }
  return names;
}

}  // namespace

std::string command_help(const CommandSpec& command) {
  std::string text =
      "usage: ditops-sim " + std::string(command.name) + " [flags]\n" + command.summary + "\n\n";
  for (const FlagSpec& flag : command.flags) {
    std::string left = std::string("  ") + flag.name;
    if (flag.value != nullptr) left += std::string(" ") + flag.value;
    if (left.size() < 34) left.resize(34, ' ');
    text += left + " " + flag.help;
    if (flag.fallback[0] != '\0') text += std::string(" (default ") + flag.fallback + ")";
    text += "\n";
  }
  text += "  --help                           this text\n";
  return text;
}

std::string general_usage() {
  std::string text =
      "usage: ditops-sim COMMAND [flags]   (ditops-sim COMMAND --help for its flags)\n";
  for (const CommandSpec& command : commands()) {
    std::string name = std::string("  ") + command.name;
    name.resize(12, ' ');
    text += name + command.summary + "\n";
  }
  return text;
}

// ---- parse
// ---------------------------------------------------------------------------------------

Options parse_args(int argc, char** argv) {
  if (argc < 2) throw UsageError("missing command: " + command_names() + " (see --help)");
  Options options;
  options.command = find_command(argv[1]);
  if (options.command == nullptr) {
    throw UsageError("unknown command '" + std::string(argv[1]) + "' (expected " + command_names() +
                     ")");
  }
  for (int i = 2; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      options.help = true;
      return options;
    }
  }
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    const auto& flags = options.command->flags;
    const auto spec = std::find_if(flags.begin(), flags.end(), [&](const FlagSpec& candidate) {
      return flag == candidate.name;
    });
    if (spec == flags.end()) {
      throw UsageError("unknown flag '" + flag + "' for 'ditops-sim " + options.command->name +
                       "' (see ditops-sim " + options.command->name + " --help)");
    }
    if (spec->value == nullptr) {
      options.json = true;
      continue;
    }
    if (i + 1 >= argc) throw UsageError(flag + " needs a value");
    if (options.values.count(flag) != 0) throw UsageError(flag + " given twice");
    options.values[flag] = argv[++i];
  }
  return options;
}

namespace {

int parse_int(const std::string& flag, const std::string& text) {
  if (text.empty() || text.size() > 9 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    throw UsageError(flag + " expects a positive integer (got '" + text + "')");
  }
  return std::stoi(text);
}

}  // namespace

std::vector<int> parse_list(const std::string& flag, const std::string& text) {
  std::vector<int> values;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = text.find(',', start);
    values.push_back(parse_int(flag, text.substr(start, comma - start)));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return values;
}

int int_flag(const Options& options, const char* flag, int fallback) {
  const auto text = options.get(flag);
  return text ? parse_int(flag, *text) : fallback;
}

sim::HwParams load_hw(const Options& options) {
  sim::HwParams hw;
  if (const auto path = options.get("--hw")) {
    try {
      hw = sim::load_hw_file(*path);
    } catch (const sim::SimError& error) {
      throw UsageError(std::string("--hw ") + error.what());
    }
  }
  if (const auto overrides = options.get("--set")) {
    try {
      sim::apply_overrides(hw, *overrides);
    } catch (const sim::SimError& error) {
      throw UsageError(std::string("--set: ") + error.what());
    }
  }
  return hw;
}

sim::MlaOptimizations parse_opts(const Options& options) {
  try {
    return sim::parse_mla_opts(options.get("--opt").value_or("none"));
  } catch (const sim::SimError& error) {
    throw UsageError(std::string("--opt: ") + error.what());
  }
}

double parse_double(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value)) {
    throw UsageError(flag + " expects a number (got '" + text + "')");
  }
  return value;
}

}  // namespace ditops::tools::sim_cli
