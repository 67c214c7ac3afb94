// ditops-sim: the Ascend 910B pipeline simulator's command line.
//
//   ditops-sim mla | sweep | fa | hw | calibrate [flags]       ditops-sim COMMAND --help lists a
//   command's flags
//
// Parsing (the command table below: every flag with its value and default), running (building
// and simulating programs) and reporting (tables, JSON, trace / CSV / SVG files) are separate
// steps. Bad flags or values print one line on stderr and exit with status 2; so do input files
// that are not regular files (a directory, /dev/zero, a FIFO) or are larger than 64 MiB, and
// output paths that exist but are not regular files.

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "sim/calibrate.hpp"
#include "sim/engine.hpp"
#include "sim/error.hpp"
#include "sim/fa.hpp"
#include "sim/hw.hpp"
#include "sim/mla.hpp"
#include "sim/report.hpp"
#include "tools/bench_json.hpp"

namespace {

namespace sim = ditops::sim;

constexpr int kExitUsage = 2;
constexpr int kExitIo = 1;

/// A command-line mistake: one line on stderr, exit status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Programs are refused above this many instructions unless --max-instructions raises it: the
/// simulator holds ~30 bytes per instruction (~1 GiB here; a --trace or --svg adds ~40 bytes of
/// timing record each), and a batch 4096, kv 1M, 1024-head run would need 3 TB.
constexpr int kDefaultMaxInstructions = 30'000'000;

// ---- the commands and their flags
// ----------------------------------------------------------------

struct FlagSpec {
  const char* name;
  const char* value;     // what the value looks like; nullptr for a switch (--json)
  const char* fallback;  // the default, "" when there is none
  const char* help;
};

struct CommandSpec {
  const char* name;
  const char* summary;
  std::vector<FlagSpec> flags;
};

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

const std::vector<CommandSpec>& commands() {
  static const std::vector<CommandSpec> table = {
      {"mla",
       "simulate the int8 MLA paged-decode kernel once and report where the time goes",
       {{"--batch", "N", "1", "sequences"},
        {"--kv", "N", "2048", "KV tokens per sequence"},
        {"--heads", "N", "128", "query heads (one latent KV head)"},
        {"--q-len", "N", "1", "query tokens per sequence (MTP)"},
        {"--cores", "N", "24", "AI cores the kernel launches on (at most num_cores)"},
        {"--block-size", "64|128", "128", "paged KV block size"},
        {"--chunk", "1|2|4", "2", "QK stages run ahead of their PVs (ops/schedule)"},
        kOptFlag,
        kHwFlag,
        kSetFlag,
        kMaxInstructionsFlag,
        kModeFlag,
        kTraceFlag,
        kCsvFlag,
        kSvgFlag,
        kJsonFlag}},
      {"sweep",
       "simulate the MLA kernel over a (batch, kv, chunk) grid; ratios to chunk 1",
       {{"--batch", "N[,N...]", "1,2,4,8,16,24,48", "sequences"},
        {"--kv", "N[,N...]", "512,2048,4096", "KV tokens per sequence"},
        {"--chunk", "C[,C...]", "1,2,4", "chunk sizes (1, 2 or 4)"},
        {"--heads", "N", "128", "query heads"},
        {"--q-len", "N", "1", "query tokens per sequence"},
        {"--cores", "N", "24", "AI cores"},
        {"--block-size", "64|128", "128", "paged KV block size"},
        kOptFlag,
        kHwFlag,
        kSetFlag,
        kMaxInstructionsFlag,
        kModeFlag,
        {"--cpu", "BENCH.json", "",
         "put the CPU kernel's chunk ratios beside the simulator's (ditops_bench mla_grid "
         "--benchmark_out)"},
        {"--cpu-threads", "N", "2", "the CPU runs' thread count to compare (needs --cpu)"},
        kJsonFlag}},
      {"fa",
       "simulate prefill flash attention (dense or block-sparse) once and report where the "
       "time goes",
       {{"--batch", "N", "1", "batch"},
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
         "RainFusion pattern of head h: the list's entry h mod its length"},
        kOptFlag,
        kHwFlag,
        kSetFlag,
        kMaxInstructionsFlag,
        kModeFlag,
        kTraceFlag,
        kCsvFlag,
        kSvgFlag,
        kJsonFlag}},
      {"calibrate",
       "fit hardware parameters to measured MLA times or speedups (sim/README.md: \"How to "
       "calibrate against msprof\")",
       {{"--measured", "FILE.csv", "",
         "measurements: batch,kv,chunk,opt[,heads,q_len,cores,block_size] and time_us, or "
         "speedup with base_chunk,base_opt (required)"},
        kHwFlag,
        kSetFlag,
        {"--fit", "NAME[,NAME...]", "every U-tagged parameter but kernel_launch_us",
         "parameters to fit, each within [1/4, 4] x its start"},
        {"--out", "FITTED.json", "", "write the fitted parameters as a --hw file"},
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

struct Options {
  const CommandSpec* command = nullptr;
  std::map<std::string, std::string> values;  // flag -> raw value
  bool json = false;
  bool help = false;

  std::optional<std::string> get(const std::string& flag) const {
    const auto found = values.find(flag);
    if (found == values.end()) return std::nullopt;
    return found->second;
  }
  bool is(const char* name) const { return std::string(command->name) == name; }
};

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

int parse_int(const std::string& flag, const std::string& text) {
  if (text.empty() || text.size() > 9 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    throw UsageError(flag + " expects a positive integer (got '" + text + "')");
  }
  return std::stoi(text);
}

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

/// The integer flag's value, or `fallback` when it is not given.
int int_flag(const Options& options, const char* flag, int fallback) {
  const auto text = options.get(flag);
  return text ? parse_int(flag, *text) : fallback;
}

// --hw FILE, then --set NAME=VALUE[,NAME=VALUE...] overrides (for sensitivity sweeps).
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

/// The shared mla/sweep options; a sweep's list flags are set by the caller.
sim::MlaConfig mla_config(const Options& options, const sim::HwParams& hw) {
  sim::MlaConfig config;
  config.cores = int_flag(options, "--cores", std::min(static_cast<int>(hw.num_cores), 24));
  config.heads = int_flag(options, "--heads", config.heads);
  config.q_len = int_flag(options, "--q-len", config.q_len);
  config.block_size = int_flag(options, "--block-size", config.block_size);
  if (options.is("mla")) {
    config.batch = int_flag(options, "--batch", config.batch);
    config.kv = int_flag(options, "--kv", config.kv);
    config.chunk = int_flag(options, "--chunk", config.chunk);
  }
  config.opts = parse_opts(options);
  return config;
}

/// The model a run uses (--mode) and why, for the report.
struct ModeChoice {
  sim::SimMode mode = sim::SimMode::fine;
  std::string reason;
};

/// --mode fine or coarse as asked; auto runs fine unless the fine program would exceed
/// --max-instructions, then coarse. Either program is refused, before it is built, when its
/// estimate (instructions, or stage events in coarse mode: each takes about as much memory)
/// exceeds the limit.
ModeChoice choose_mode(const Options& options,
                       const std::function<std::uint64_t(sim::SimMode)>& estimate,
                       const std::string& description) {
  const std::string asked = options.get("--mode").value_or("auto");
  if (asked != "fine" && asked != "coarse" && asked != "auto") {
    throw UsageError("--mode must be fine, coarse or auto (got '" + asked + "')");
  }
  const auto limit =
      static_cast<std::uint64_t>(int_flag(options, "--max-instructions", kDefaultMaxInstructions));
  ModeChoice choice;
  if (asked != "coarse") {
    const std::uint64_t fine = estimate(sim::SimMode::fine);
    const std::string size = "about " + std::to_string(fine) + " instructions";
    if (fine <= limit) {
      if (asked == "auto") {
        choice.reason = "auto: the fine program has " + size + ", within --max-instructions";
      }
      return choice;
    }
    if (asked == "fine") {
      throw UsageError(description + " needs " + size + ", more than the limit of " +
                       std::to_string(limit) +
                       " (~30 bytes each); raise it with --max-instructions N or use --mode "
                       "coarse");
    }
    choice.reason = "auto: the fine program would have " + size + ", above --max-instructions " +
                    std::to_string(limit);
  }
  choice.mode = sim::SimMode::coarse;
  const std::uint64_t coarse = estimate(sim::SimMode::coarse);
  if (coarse > limit) {
    throw UsageError(description + " needs about " + std::to_string(coarse) +
                     " stage events in coarse mode, more than the limit of " +
                     std::to_string(limit) + "; raise it with --max-instructions N");
  }
  return choice;
}

/// The report's line on the model that ran.
std::string mode_line(const ModeChoice& choice) {
  std::string text = choice.mode == sim::SimMode::coarse
                         ? "mode: coarse (one event per core, unit and stage; sim/README.md)"
                         : "mode: fine (every instruction)";
  if (!choice.reason.empty()) text += "; " + choice.reason;
  return text;
}

/// The configuration's values, and the model it runs in (from the size of its program,
/// estimated before it is built).
ModeChoice validate_config(sim::MlaConfig& config, const sim::HwParams& hw,
                           const Options& options) {
  try {
    sim::validate(config, hw);
  } catch (const sim::SimError& error) {
    throw UsageError(std::string("--") + error.what());
  }
  const ModeChoice choice = choose_mode(
      options,
      [&](sim::SimMode mode) {
        sim::MlaConfig sized = config;
        sized.mode = mode;
        return sim::estimate_mla_instructions(sized, hw);
      },
      sim::describe(config));
  config.mode = choice.mode;
  return choice;
}

// ---- run
// -----------------------------------------------------------------------------------------

/// One simulated program and what the reports need of it.
struct Run {
  sim::Program program;
  sim::SimResult result;
  sim::Summary summary;
};

Run simulate(sim::Program program, const sim::HwParams& hw, bool record) {
  sim::EngineOptions engine_options;
  engine_options.record_instructions = record;
  Run run{std::move(program), {}, {}};
  run.result = sim::simulate(run.program, hw, engine_options);
  run.summary = sim::summarize(run.program, run.result, hw);
  return run;
}

/// Output files (--trace, --csv, --svg) record the instruction times.
bool wants_files(const Options& options) { return options.get("--trace") || options.get("--svg"); }

struct SweepRow {
  int batch, kv, chunk;
  sim::SimMode mode;
  sim::Summary summary;
};

/// Simulates every configuration; progress on stderr (live on a terminal, else once a second).
std::vector<SweepRow> run_sweep(const std::vector<sim::MlaConfig>& configs,
                                const sim::HwParams& hw) {
  std::vector<SweepRow> rows;
  const std::size_t total = configs.size();
  const bool tty = isatty(fileno(stderr)) != 0;
  auto last_report = std::chrono::steady_clock::now();
  for (const sim::MlaConfig& config : configs) {
    rows.push_back({config.batch, config.kv, config.chunk, config.mode,
                    simulate(sim::build_mla_program(config, hw), hw, false).summary});
    const auto now = std::chrono::steady_clock::now();
    if (total > 1 && (tty || now - last_report > std::chrono::seconds(1))) {
      std::fprintf(stderr,
                   tty ? "\rsweep %zu/%zu (batch %d kv %d chunk %d)   "
                       : "sweep %zu/%zu (batch %d kv %d chunk %d)\n",
                   rows.size(), total, config.batch, config.kv, config.chunk);
      last_report = now;
    }
  }
  if (tty && total > 1) std::fprintf(stderr, "\r%60s\r", "");
  return rows;
}

// ---- report
// --------------------------------------------------------------------------------------

/// Writes an output file. An existing path that is not a regular file (a directory, a FIFO, a
/// device, a symbolic link) is refused: a report never writes through it.
void write_file(const std::string& flag, const std::string& path,
                const std::function<void(std::ostream&)>& writer) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::symlink_status(path, error);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status)) {
    throw UsageError(flag + " '" + path + "' exists and is not a regular file");
  }
  std::ofstream file(path);
  if (!file) throw std::runtime_error("cannot write " + flag + " file " + path);
  writer(file);
  if (!file) throw std::runtime_error("error writing " + flag + " file " + path);
}

/// --trace, --csv and --svg of one run.
void write_run_files(const Options& options, const Run& run, const sim::HwParams& hw,
                     const std::string& title) {
  if (const auto path = options.get("--trace")) {
    write_file("--trace", *path, [&](std::ostream& out) {
      sim::write_chrome_trace(out, run.program, run.result, hw);
    });
  }
  if (const auto path = options.get("--csv")) {
    write_file("--csv", *path,
               [&](std::ostream& out) { sim::write_pipe_csv(out, run.program, run.result, hw); });
  }
  if (const auto path = options.get("--svg")) {
    write_file("--svg", *path,
               [&](std::ostream& out) { sim::write_svg(out, run.program, run.result, hw, title); });
  }
}

/// One run's JSON object: `head` (config, plan) followed by the summary's fields.
void print_run_json(nlohmann::ordered_json head, const sim::Summary& summary) {
  const nlohmann::ordered_json details = sim::summary_json(summary);
  for (auto it = details.begin(); it != details.end(); ++it) head[it.key()] = it.value();
  std::cout << head.dump(2) << '\n';
}

std::string plan_text(const sim::MlaConfig& config, const sim::MlaPlan& plan) {
  std::string text = "plan: " + std::to_string(config.batch) + " sequence(s) x " +
                     std::to_string(plan.head_groups) + " head group(s) of " +
                     std::to_string(plan.heads_per_group) + " heads x " +
                     std::to_string(plan.splits) +
                     " KV split(s) = " + std::to_string(plan.tasks.size()) + " tasks on " +
                     std::to_string(plan.cores_used) + " cores, " +
                     std::to_string(plan.blocks_per_sequence) + " blocks per sequence";
  if (plan.combine) text += ", combine pass";
  return text;
}

int command_mla(const Options& options) {
  const sim::HwParams hw = load_hw(options);
  sim::MlaConfig config = mla_config(options, hw);
  const ModeChoice mode = validate_config(config, hw, options);
  sim::MlaPlan plan;
  const Run run = simulate(sim::build_mla_program(config, hw, &plan), hw, wants_files(options));
  const std::string title = "ditops-sim mla: " + sim::describe(config);
  write_run_files(options, run, hw, title);
  if (!options.json) {
    std::cout << sim::format_table(
        run.summary, title + "\n" + mode_line(mode) + "\n" + plan_text(config, plan) + "\n");
    return 0;
  }
  nlohmann::ordered_json head;
  head["mode"] = sim::sim_mode_name(config.mode);
  if (!mode.reason.empty()) head["mode_reason"] = mode.reason;
  head["config"] = {{"batch", config.batch}, {"kv", config.kv},
                    {"heads", config.heads}, {"q_len", config.q_len},
                    {"cores", config.cores}, {"block_size", config.block_size},
                    {"chunk", config.chunk}, {"opts", sim::mla_opts_to_string(config.opts)}};
  head["plan"] = {{"tasks", plan.tasks.size()},
                  {"splits", plan.splits},
                  {"head_groups", plan.head_groups},
                  {"cores_used", plan.cores_used},
                  {"combine", plan.combine}};
  print_run_json(head, run.summary);
  return 0;
}

/// CPU MLA decode times (us) by (batch, kv, heads, chunk, threads) from Google Benchmark JSON
/// (mla_grid / mla_decode entries; the median when a configuration ran more than once), read
/// through tools/bench_json.hpp: NaN or infinite fields are left out with a warning.
using CpuTimes = std::map<std::array<int, 5>, double>;

CpuTimes load_cpu_times(const std::string& path) {
  std::map<std::array<int, 5>, std::vector<double>> samples;
  try {
    const std::map<std::string, double> us_per_unit = {
        {"ns", 1e-3}, {"us", 1.0}, {"ms", 1e3}, {"s", 1e6}};
    for (const auto& entry :
         ditops::tools::read_bench_json(path, "ditops-sim: --cpu: ", std::cerr)) {
      const std::string name = entry.text("run_name", entry.name());
      if (name.rfind("mla_", 0) != 0) continue;
      if (entry.text("run_type", "iteration") != "iteration") continue;
      if (entry.flag("error_occurred", false) || !entry.has("real_time")) continue;
      // Arguments "key:value" between slashes (mla_grid/b:1/kv:512/h:16/chunk:1/threads:1/...).
      std::map<std::string, int> args;
      std::size_t start = name.find('/');
      while (start != std::string::npos) {
        const std::size_t end = name.find('/', start + 1);
        const std::string part = name.substr(start + 1, end - start - 1);
        const std::size_t colon = part.find(':');
        if (colon != std::string::npos && colon + 1 < part.size() && part.size() - colon < 10 &&
            part.find_first_not_of("0123456789", colon + 1) == std::string::npos) {
          args[part.substr(0, colon)] = std::stoi(part.substr(colon + 1));
        }
        start = end;
      }
      if (args.count("splits") != 0 && args["splits"] != 0) continue;  // forced split counts
      const std::string unit_name = entry.text("time_unit", "ns");
      const auto unit = us_per_unit.find(unit_name);
      if (unit == us_per_unit.end()) {
        entry.fail("time_unit", "is '" + unit_name + "', not ns, us, ms or s");
      }
      const double us = entry.number("real_time", 0) * unit->second;
      if (!std::isfinite(us)) {  // JSON output would show it as null
        std::cerr << "ditops-sim: --cpu: warning: '" << path << "': entry '" << entry.name()
                  << "': field 'real_time' is not a finite number of us; left out\n";
        continue;
      }
      samples[{args["b"], args["kv"], args["h"], args["chunk"], args["threads"]}].push_back(us);
    }
  } catch (const ditops::tools::BenchJsonError& error) {
    throw UsageError(std::string("--cpu: ") + error.what());
  }
  CpuTimes times;
  for (auto& [key, values] : samples) {  // the median
    std::sort(values.begin(), values.end());
    const std::size_t n = values.size();
    times[key] = n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  }
  if (times.empty()) throw UsageError("--cpu: no mla_grid or mla_decode entries in '" + path + "'");
  return times;
}

double parse_double(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value)) {
    throw UsageError(flag + " expects a number (got '" + text + "')");
  }
  return value;
}

/// The fa flags, validated; `mode` gets the model the run uses.
sim::FaConfig fa_config(const Options& options, const sim::HwParams& hw, ModeChoice& mode) {
  sim::FaConfig config;
  config.batch = int_flag(options, "--batch", config.batch);
  config.heads = int_flag(options, "--heads", config.heads);
  config.dim = int_flag(options, "--dim", config.dim);
  config.cores = int_flag(options, "--cores", std::min(static_cast<int>(hw.num_cores), 24));
  config.chunk = int_flag(options, "--chunk", config.chunk);
  const std::string dtype = options.get("--dtype").value_or("bf16");
  if (dtype != "bf16" && dtype != "int8") {
    throw UsageError("--dtype must be bf16 or int8 (got '" + dtype + "')");
  }
  config.int8 = dtype == "int8";
  config.opts = parse_opts(options);
  if (const auto video = options.get("--video")) {
    if (options.get("--density")) throw UsageError("--density and --video exclude each other");
    const std::vector<int> extents = parse_list("--video", *video);
    if (extents.size() != 3) throw UsageError("--video expects T,H,W (got '" + *video + "')");
    config.rainfusion = true;
    config.frames = extents[0];
    config.height = extents[1];
    config.width = extents[2];
    config.text = int_flag(options, "--text", 0);
    if (const auto sparsity = options.get("--sparsity")) {
      config.sparsity = parse_double("--sparsity", *sparsity);
    }
    if (const auto patterns = options.get("--pattern")) {
      try {
        config.patterns = sim::parse_fa_patterns(*patterns);
      } catch (const sim::SimError& error) {
        throw UsageError(std::string("--pattern: ") + error.what());
      }
    }
    const long long tokens =
        static_cast<long long>(config.frames) * config.height * config.width + config.text;
    config.seq = tokens > (1 << 20) ? (1 << 20) + 1 : static_cast<int>(tokens);
  } else {
    for (const char* flag : {"--text", "--sparsity", "--pattern"}) {
      if (options.get(flag)) throw UsageError(std::string(flag) + " needs --video");
    }
    if (const auto density = options.get("--density")) {
      config.density = parse_double("--density", *density);
    }
  }
  config.seq = int_flag(options, "--seq", config.seq);
  config.kv_seq = int_flag(options, "--kv-seq", 0);
  try {
    sim::validate(config, hw);
  } catch (const sim::SimError& error) {
    throw UsageError(std::string("--") + error.what());
  }
  mode = choose_mode(
      options,
      [&](sim::SimMode candidate) {
        sim::FaConfig sized = config;
        sized.mode = candidate;
        return sim::estimate_fa_instructions(sized, hw);
      },
      sim::describe(config));
  config.mode = mode.mode;
  return config;
}

int command_fa(const Options& options) {
  const sim::HwParams hw = load_hw(options);
  ModeChoice mode;
  const sim::FaConfig config = fa_config(options, hw, mode);
  sim::FaPlan plan;
  const Run run = simulate(sim::build_fa_program(config, hw, &plan), hw, wants_files(options));
  const std::string title = "ditops-sim fa: " + sim::describe(config);
  write_run_files(options, run, hw, title);
  std::string masks;
  for (const std::string& name : plan.mask_names) masks += (masks.empty() ? "" : ",") + name;
  if (!options.json) {
    char kept[32];
    std::snprintf(kept, sizeof kept, "%.3f", plan.kept_share);
    const std::string plan_line = "plan: " + std::to_string(plan.tasks.size()) +
                                  " tasks (batch x heads x " + std::to_string(plan.q_tiles) +
                                  " query tiles of 128) on " + std::to_string(plan.cores_used) +
                                  " cores, " + std::to_string(plan.kv_blocks) + " KV blocks, " +
                                  std::to_string(plan.kv_tile_tokens) + " keys per stage, masks " +
                                  masks + ", kept share " + kept;
    std::cout << sim::format_table(run.summary,
                                   title + "\n" + mode_line(mode) + "\n" + plan_line + "\n");
    if (config.rainfusion) {
      const sim::FaBreakdown breakdown =
          sim::rainfusion_breakdown(config, hw, plan, run.summary.time_us);
      std::printf(
          "\nRainFusion: ideal speedup over dense 1 / (1 - %s) = %.2fx; where the time "
          "goes (sim/README.md):\n",
          sim::number_text(config.sparsity).c_str(), breakdown.ideal_speedup);
      for (const auto& [name, us] : breakdown.parts) {
        std::printf("  %-62s %12.1f us  %5.1f%%\n", name.c_str(), us,
                    100 * us / run.summary.time_us);
      }
    }
    return 0;
  }
  nlohmann::ordered_json head;
  head["mode"] = sim::sim_mode_name(config.mode);
  if (!mode.reason.empty()) head["mode_reason"] = mode.reason;
  head["config"] = {{"batch", config.batch},
                    {"heads", config.heads},
                    {"seq", config.seq},
                    {"kv_seq", config.kv_seq > 0 ? config.kv_seq : config.seq},
                    {"dim", config.dim},
                    {"dtype", config.int8 ? "int8" : "bf16"},
                    {"cores", config.cores},
                    {"chunk", config.chunk},
                    {"opts", sim::mla_opts_to_string(config.opts)}};
  head["plan"] = {{"tasks", plan.tasks.size()},    {"q_tiles", plan.q_tiles},
                  {"kv_blocks", plan.kv_blocks},   {"kv_tile_tokens", plan.kv_tile_tokens},
                  {"cores_used", plan.cores_used}, {"masks", plan.mask_names},
                  {"kept_share", plan.kept_share}};
  if (config.rainfusion) {
    const sim::FaBreakdown breakdown =
        sim::rainfusion_breakdown(config, hw, plan, run.summary.time_us);
    nlohmann::ordered_json parts = nlohmann::ordered_json::object();
    for (const auto& [name, us] : breakdown.parts) parts[name] = us;
    head["rainfusion"] = {{"sparsity", config.sparsity},
                          {"ideal_speedup", breakdown.ideal_speedup},
                          {"time_us_by_part", parts}};
  }
  print_run_json(head, run.summary);
  return 0;
}

/// The sweep's (batch, kv, chunk) grid, every configuration validated before the first runs.
std::vector<sim::MlaConfig> sweep_grid(const Options& options, const sim::HwParams& hw,
                                       std::vector<int>& chunks) {
  const sim::MlaConfig base = mla_config(options, hw);
  const auto list = [&](const char* flag, const std::vector<int>& fallback) {
    const auto text = options.get(flag);
    return text ? parse_list(flag, *text) : fallback;
  };
  const std::vector<int> batches = list("--batch", {1, 2, 4, 8, 16, 24, 48});
  const std::vector<int> kvs = list("--kv", {512, 2048, 4096});
  chunks = list("--chunk", {1, 2, 4});
  std::vector<sim::MlaConfig> configs;
  for (const int batch : batches) {
    for (const int kv : kvs) {
      for (const int chunk : chunks) {
        sim::MlaConfig config = base;
        config.batch = batch;
        config.kv = kv;
        config.chunk = chunk;
        validate_config(config, hw, options);  // sets config.mode
        configs.push_back(config);
      }
    }
  }
  return configs;
}

void report_sweep(const Options& options, const sim::MlaConfig& base,
                  const std::vector<int>& chunks, const std::vector<SweepRow>& rows,
                  const CpuTimes& cpu, int cpu_threads) {
  const auto cpu_time = [&](int batch, int kv, int chunk) {
    const auto found = cpu.find({batch, kv, base.heads, chunk, cpu_threads});
    return found == cpu.end() ? -1.0 : found->second;
  };
  // Ratios are to chunk=1 of the same (batch, kv), or to the first chunk listed without it.
  const int reference_chunk =
      std::find(chunks.begin(), chunks.end(), 1) != chunks.end() ? 1 : chunks.front();
  const auto reference_time = [&](const SweepRow& row) {
    for (const SweepRow& other : rows) {
      if (other.batch == row.batch && other.kv == row.kv && other.chunk == reference_chunk) {
        return other.summary.time_us;
      }
    }
    return row.summary.time_us;
  };
  if (options.json) {
    nlohmann::ordered_json array = nlohmann::ordered_json::array();
    for (const SweepRow& row : rows) {
      nlohmann::ordered_json item;
      item["batch"] = row.batch;
      item["kv"] = row.kv;
      item["chunk"] = row.chunk;
      item["mode"] = sim::sim_mode_name(row.mode);
      item["time_us"] = row.summary.time_us;
      item["cycles"] = row.summary.cycles;
      item["ratio_to_chunk" + std::to_string(reference_chunk)] =
          row.summary.time_us / reference_time(row);
      const nlohmann::ordered_json summary = sim::summary_json(row.summary);
      item["pipes"] = summary["pipes"];
      item["bubbles"] = summary["bubbles"];
      item["instructions"] = row.summary.instructions;
      const double cpu_us = cpu_time(row.batch, row.kv, row.chunk),
                   cpu_reference = cpu_time(row.batch, row.kv, reference_chunk);
      if (cpu_us > 0) {
        item["cpu_time_us"] = cpu_us;
        if (cpu_reference > 0) {
          item["cpu_ratio_to_chunk" + std::to_string(reference_chunk)] = cpu_us / cpu_reference;
        }
      }
      array.push_back(item);
    }
    std::cout << array.dump(2) << '\n';
    return;
  }
  std::string header = sim::describe(base);
  header = header.substr(header.find("heads"));
  header.replace(header.find(", chunk"), header.find(", opts") - header.find(", chunk"), "");
  std::printf("ditops-sim sweep: %s\n", header.c_str());
  const auto coarse_rows = std::count_if(rows.begin(), rows.end(), [](const SweepRow& row) {
    return row.mode == sim::SimMode::coarse;
  });
  std::printf("mode: %s\n", coarse_rows == 0 ? "fine (every instruction)"
                            : coarse_rows == static_cast<long>(rows.size())
                                ? "coarse (one event per core, unit and stage; sim/README.md)"
                                : "fine, and coarse where the fine program would exceed "
                                  "--max-instructions (marked c)");
  std::printf("time in us; (xN) = time / time at chunk=%d; AIC/AIV = compute-pipe idle share\n\n",
              reference_chunk);
  if (!cpu.empty()) {
    std::printf("CPU: %s, %d thread(s), heads %d; ratio = time / time at chunk=%d\n\n",
                options.get("--cpu")->c_str(), cpu_threads, base.heads, reference_chunk);
  }
  std::printf("batch     kv");
  for (const int chunk : chunks) {
    std::printf("  | chunk=%d  us    ratio  AIC idle AIV idle", chunk);
    if (!cpu.empty()) std::printf("  CPU us   ratio");
  }
  std::printf("\n");
  for (std::size_t i = 0; i < rows.size(); i += chunks.size()) {
    std::printf("%5d %6d", rows[i].batch, rows[i].kv);
    for (std::size_t c = 0; c < chunks.size(); ++c) {
      const SweepRow& row = rows[i + c];
      std::printf("  |%c%11.2f  (x%.3f)  %5.1f%%   %5.1f%%",
                  row.mode == sim::SimMode::coarse && coarse_rows < static_cast<long>(rows.size())
                      ? 'c'
                      : ' ',
                  row.summary.time_us, row.summary.time_us / reference_time(row),
                  100.0 * row.summary.bubbles[0].idle, 100.0 * row.summary.bubbles[1].idle);
      if (cpu.empty()) continue;
      const double cpu_us = cpu_time(row.batch, row.kv, row.chunk),
                   cpu_reference = cpu_time(row.batch, row.kv, reference_chunk);
      if (cpu_us > 0 && cpu_reference > 0) {
        std::printf(" %8.1f (x%.3f)", cpu_us, cpu_us / cpu_reference);
      } else {
        std::printf("        -        -");
      }
    }
    std::printf("\n");
  }
}

int command_sweep(const Options& options) {
  const sim::HwParams hw = load_hw(options);
  std::vector<int> chunks;
  const std::vector<sim::MlaConfig> configs = sweep_grid(options, hw, chunks);
  // The CPU kernel's times for the same grid (--cpu), at --cpu-threads threads.
  CpuTimes cpu;
  if (const auto path = options.get("--cpu")) cpu = load_cpu_times(*path);
  if (options.get("--cpu-threads") && cpu.empty()) throw UsageError("--cpu-threads needs --cpu");
  const int cpu_threads = int_flag(options, "--cpu-threads", 2);
  const std::vector<SweepRow> rows = run_sweep(configs, hw);
  report_sweep(options, mla_config(options, hw), chunks, rows, cpu, cpu_threads);
  return 0;
}

std::string fixed(double value, int digits) {
  char text[32];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

int command_calibrate(const Options& options) {
  const sim::HwParams start = load_hw(options);
  const auto path = options.get("--measured");
  if (!path) throw UsageError("calibrate needs --measured FILE.csv");
  std::vector<sim::Measurement> rows;
  try {
    rows = sim::load_measurements(*path, start);
  } catch (const sim::SimError& error) {
    throw UsageError(std::string("--measured ") + error.what());
  }
  std::vector<std::string> names = sim::default_fit_names();
  if (const auto list = options.get("--fit")) {
    names.clear();
    std::stringstream stream(*list);
    std::string name;
    while (std::getline(stream, name, ',')) names.push_back(name);
  }
  sim::FitResult fit;
  try {
    fit = sim::fit_parameters(rows, start, names);
  } catch (const sim::SimError& error) {
    throw UsageError(std::string("--fit: ") + error.what());
  }
  if (const auto out = options.get("--out")) {
    write_file("--out", *out, [&](std::ostream& stream) { stream << sim::hw_to_json(fit.fitted); });
  }
  const auto row_label = [&](const sim::Measurement& m) {
    std::string text = "batch " + std::to_string(m.config.batch) + " kv " +
                       std::to_string(m.config.kv) + " chunk " + std::to_string(m.config.chunk) +
                       " " + sim::mla_opts_to_string(m.config.opts);
    if (m.speedup) {
      text +=
          " vs chunk " + std::to_string(m.base.chunk) + " " + sim::mla_opts_to_string(m.base.opts);
    }
    return text;
  };
  if (options.json) {
    nlohmann::ordered_json json;
    nlohmann::ordered_json params = nlohmann::ordered_json::object();
    for (std::size_t i = 0; i < fit.names.size(); ++i) {
      params[fit.names[i]] = {{"start", fit.start[i]}, {"fitted", fit.value[i]}};
    }
    json["params"] = params;
    nlohmann::ordered_json array = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const sim::Measurement& m = rows[i];
      const sim::FitRow& row = fit.rows[i];
      array.push_back({{"row", m.row},
                       {"config", row_label(m)},
                       {"kind", m.speedup ? "speedup" : "time_us"},
                       {"measured", row.measured},
                       {"predicted_before", row.before},
                       {"predicted_after", row.after},
                       {"predicted_held_out", row.held_out},
                       {"error_before", std::log(row.before / row.measured)},
                       {"error_after", std::log(row.after / row.measured)}});
    }
    json["rows"] = array;
    json["error_before"] = fit.error_before;
    json["error_after"] = fit.error_after;
    json["error_held_out"] = fit.error_held_out;
    json["evaluations"] = fit.evaluations;
    std::cout << json.dump(2) << '\n';
    return 0;
  }
  std::cout << "ditops-sim calibrate: " << rows.size() << " rows from " << *path << ", "
            << fit.evaluations << " simulations of the set\n"
            << "errors are ln(predicted / measured); held-out = the leave-one-out prediction "
               "(the fit without that row, to first order)\n\n";
  std::printf("%4s  %-48s %10s %10s %10s %10s %8s %8s\n", "row", "configuration", "measured",
              "before", "after", "held-out", "err bef", "err aft");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const sim::FitRow& row = fit.rows[i];
    std::printf("%4d  %-48s %10.3f %10.3f %10.3f %10.3f %7.1f%% %7.1f%%\n", rows[i].row,
                (row_label(rows[i]) + (rows[i].speedup ? " (speedup)" : " (us)")).c_str(),
                row.measured, row.before, row.after, row.held_out,
                100 * std::log(row.before / row.measured),
                100 * std::log(row.after / row.measured));
  }
  std::printf("\n%-34s %12s %12s %8s\n", "parameter", "start", "fitted", "ratio");
  for (std::size_t i = 0; i < fit.names.size(); ++i) {
    std::printf("%-34s %12s %12s %8s\n", fit.names[i].c_str(),
                sim::number_text(fit.start[i]).c_str(), sim::number_text(fit.value[i]).c_str(),
                fixed(fit.value[i] / fit.start[i], 3).c_str());
  }
  std::printf("\nRMS error: before %.1f %%, after %.1f %%, held-out (leave-one-out) %.1f %%\n",
              100 * fit.error_before, 100 * fit.error_after, 100 * fit.error_held_out);
  return 0;
}

int command_hw(const Options& options) {
  std::cout << sim::hw_to_json(load_hw(options));
  return 0;
}

std::string one_line(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h" ||
                    std::string(argv[1]) == "help")) {
    std::cout << general_usage();
    return 0;
  }
  try {
    const Options options = parse_args(argc, argv);
    if (options.help) {
      std::cout << command_help(*options.command);
      return 0;
    }
    if (options.is("mla")) return command_mla(options);
    if (options.is("sweep")) return command_sweep(options);
    if (options.is("fa")) return command_fa(options);
    if (options.is("calibrate")) return command_calibrate(options);
    return command_hw(options);
  } catch (const UsageError& error) {
    std::cerr << "ditops-sim: " << one_line(error.what()) << '\n';
    return kExitUsage;
  } catch (const sim::SimError& error) {
    // Simulation errors (buffer overflow, deadlock) come from the user's parameters.
    std::cerr << "ditops-sim: " << one_line(error.what()) << '\n';
    return kExitUsage;
  } catch (const std::exception& error) {
    std::cerr << "ditops-sim: " << one_line(error.what()) << '\n';
    return kExitIo;
  }
}
