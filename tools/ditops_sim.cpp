// ditops-sim: the Ascend 910B pipeline simulator's command line.
//
//   ditops-sim mla   [--batch 1] [--kv 2048] [--heads 128] [--q-len 1] [--cores 24]
//                    [--block-size 128] [--chunk 1|2|4] [--opt NAME[,NAME...]] [--hw FILE.json]
//                    [--trace FILE.json] [--csv FILE.csv] [--svg FILE.svg] [--json]
//   ditops-sim sweep [--batch 1,2,4,8,16,24,48] [--kv 512,2048,4096] [--chunk 1,2,4]
//                    [same options] [--cpu BENCH.json [--cpu-threads 2]] [--json]
//                    --cpu puts the CPU kernel's chunk ratios for the same grid beside the
//                    simulator's: BENCH.json is ditops_bench's --benchmark_out of mla_grid.
//   ditops-sim hw    [--hw FILE.json]
//   every command also takes --set NAME=VALUE[,...] to override hardware parameters; mla and
//   sweep take --max-instructions N (default 10000000, ~1 GiB): a larger program is refused
//   before it is built.
//
// Bad flags or values print one line on stderr and exit with status 2; so do input files that
// are not regular files (a directory, /dev/zero, a FIFO) or are larger than 64 MiB.

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "sim/engine.hpp"
#include "sim/error.hpp"
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

const char* const kUsage =
    "usage: ditops-sim mla   [--batch 1] [--kv 2048] [--heads 128] [--q-len 1] [--cores 24]\n"
    "                        [--block-size 128] [--chunk 1|2|4] [--opt NAME[,NAME...]]\n"
    "                        [--hw FILE.json] [--trace FILE.json] [--csv FILE.csv]\n"
    "                        [--svg FILE.svg] [--json]\n"
    "       ditops-sim sweep [--batch 1,2,4,8,16,24,48] [--kv 512,2048,4096] [--chunk 1,2,4]\n"
    "                        [--heads ..] [--q-len ..] [--cores ..] [--block-size ..] [--opt ..]\n"
    "                        [--hw FILE.json] [--cpu BENCH.json [--cpu-threads 2]] [--json]\n"
    "       ditops-sim hw    [--hw FILE.json]   (prints the hardware parameters as JSON)\n"
    "  --set NAME=VALUE[,NAME=VALUE...] overrides hardware parameters after --hw\n"
    "  --max-instructions N (mla, sweep) refuses larger programs (default 10000000, ~1 GiB)\n";

/// Programs are refused above this many instructions unless --max-instructions raises it: the
/// simulator holds ~110 bytes per instruction (a batch 4096, kv 1M, 1024-head run would need
/// 10 TB).
constexpr int kDefaultMaxInstructions = 10'000'000;

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

struct Options {
  std::string command;
  std::map<std::string, std::string> values;  // flag -> raw value
  bool json = false;
};

Options parse_args(int argc, char** argv) {
  if (argc < 2) throw UsageError("missing command: mla, sweep or hw (see --help)");
  Options options;
  options.command = argv[1];
  if (options.command != "mla" && options.command != "sweep" && options.command != "hw") {
    throw UsageError("unknown command '" + options.command + "' (expected mla, sweep or hw)");
  }
  std::vector<std::string> allowed;
  if (options.command == "hw") {
    allowed = {"--hw", "--set"};
  } else {
    allowed = {"--batch", "--kv",  "--heads", "--q-len", "--cores",           "--block-size",
               "--chunk", "--opt", "--hw",    "--set",   "--max-instructions"};
    if (options.command == "mla") {
      for (const char* flag : {"--trace", "--csv", "--svg"}) allowed.emplace_back(flag);
    } else {
      for (const char* flag : {"--cpu", "--cpu-threads"}) allowed.emplace_back(flag);
    }
  }
  for (int i = 2; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--json" && options.command != "hw") {
      options.json = true;
      continue;
    }
    if (std::find(allowed.begin(), allowed.end(), flag) == allowed.end()) {
      throw UsageError("unknown flag '" + flag + "' for 'ditops-sim " + options.command + "'");
    }
    if (i + 1 >= argc) throw UsageError(flag + " needs a value");
    if (options.values.count(flag) != 0) throw UsageError(flag + " given twice");
    options.values[flag] = argv[++i];
  }
  return options;
}

// --hw FILE, then --set NAME=VALUE[,NAME=VALUE...] overrides (for sensitivity sweeps).
sim::HwParams load_hw(const Options& options) {
  sim::HwParams hw;
  const auto found = options.values.find("--hw");
  if (found != options.values.end()) {
    try {
      hw = sim::load_hw_file(found->second);
    } catch (const sim::SimError& error) {
      throw UsageError(std::string("--hw ") + error.what());
    }
  }
  const auto set = options.values.find("--set");
  if (set == options.values.end()) return hw;
  std::size_t start = 0;
  const std::string& text = set->second;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    const std::size_t equals = item.find('=');
    if (equals == std::string::npos)
      throw UsageError("--set expects NAME=VALUE (got '" + item + "')");
    const std::string name = item.substr(0, equals);
    const std::string value = item.substr(equals + 1);
    const sim::HwParamInfo* info = nullptr;
    for (const sim::HwParamInfo& candidate : sim::hw_param_table()) {
      if (name == candidate.name) info = &candidate;
    }
    if (info == nullptr) throw UsageError("--set: unknown hardware parameter '" + name + "'");
    char* end = nullptr;
    const double number = std::strtod(value.c_str(), &end);
    if (value.empty() || end != value.c_str() + value.size()) {
      throw UsageError("--set " + name + " expects a number (got '" + value + "')");
    }
    hw.*(info->field) = number;
    start = comma + 1;
  }
  try {
    sim::validate(hw);
  } catch (const sim::SimError& error) {
    throw UsageError(std::string("--set: ") + error.what());
  }
  return hw;
}

/// The shared mla/sweep options; list flags of a sweep are set by the caller.
sim::MlaConfig base_config(const Options& options, const sim::HwParams& hw) {
  sim::MlaConfig config;
  config.cores = static_cast<int>(hw.num_cores) < 24 ? static_cast<int>(hw.num_cores) : 24;
  const auto get = [&](const char* flag, int& target) {
    const auto found = options.values.find(flag);
    if (found != options.values.end()) target = parse_int(flag, found->second);
  };
  get("--heads", config.heads);
  get("--q-len", config.q_len);
  get("--cores", config.cores);
  get("--block-size", config.block_size);
  if (options.command == "mla") {
    get("--batch", config.batch);
    get("--kv", config.kv);
    get("--chunk", config.chunk);
  }
  const auto opt = options.values.find("--opt");
  if (opt != options.values.end()) {
    try {
      config.opts = sim::parse_mla_opts(opt->second);
    } catch (const sim::SimError& error) {
      throw UsageError(std::string("--opt: ") + error.what());
    }
  }
  return config;
}

/// The configuration's values, and the size of its program (estimated before it is built).
void validate_config(const sim::MlaConfig& config, const sim::HwParams& hw,
                     const Options& options) {
  try {
    sim::validate(config, hw);
  } catch (const sim::SimError& error) {
    throw UsageError(std::string("--") + error.what());
  }
  const auto flag = options.values.find("--max-instructions");
  const int limit = flag == options.values.end() ? kDefaultMaxInstructions
                                                 : parse_int("--max-instructions", flag->second);
  const std::uint64_t estimate = sim::estimate_mla_instructions(config, hw);
  if (estimate > static_cast<std::uint64_t>(limit)) {
    throw UsageError(sim::describe(config) + " needs about " + std::to_string(estimate) +
                     " instructions, more than the limit of " + std::to_string(limit) +
                     " (~110 bytes each); raise it with --max-instructions N");
  }
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

void write_file(const std::string& path, const std::string& what,
                const std::function<void(std::ostream&)>& writer) {
  std::ofstream file(path);
  if (!file) throw std::runtime_error("cannot write " + what + " file " + path);
  writer(file);
  if (!file) throw std::runtime_error("error writing " + what + " file " + path);
}

int run_mla(const Options& options) {
  const sim::HwParams hw = load_hw(options);
  const sim::MlaConfig config = base_config(options, hw);
  validate_config(config, hw, options);
  sim::MlaPlan plan;
  const sim::Program program = sim::build_mla_program(config, hw, &plan);
  const auto value = [&](const char* flag) {
    const auto found = options.values.find(flag);
    return found == options.values.end() ? std::string() : found->second;
  };
  sim::EngineOptions engine_options;
  engine_options.record_instructions = !value("--trace").empty() || !value("--svg").empty();
  const sim::SimResult result = sim::simulate(program, hw, engine_options);
  const sim::Summary summary = sim::summarize(program, result, hw);
  const std::string title = "ditops-sim mla: " + sim::describe(config);
  if (!value("--trace").empty()) {
    write_file(value("--trace"), "trace",
               [&](std::ostream& out) { sim::write_chrome_trace(out, program, result, hw); });
  }
  if (!value("--csv").empty()) {
    write_file(value("--csv"), "CSV",
               [&](std::ostream& out) { sim::write_pipe_csv(out, program, result, hw); });
  }
  if (!value("--svg").empty()) {
    write_file(value("--svg"), "SVG",
               [&](std::ostream& out) { sim::write_svg(out, program, result, hw, title); });
  }
  if (options.json) {
    nlohmann::ordered_json json;
    json["config"] = {{"batch", config.batch}, {"kv", config.kv},
                      {"heads", config.heads}, {"q_len", config.q_len},
                      {"cores", config.cores}, {"block_size", config.block_size},
                      {"chunk", config.chunk}, {"opts", sim::mla_opts_to_string(config.opts)}};
    json["plan"] = {{"tasks", plan.tasks.size()},
                    {"splits", plan.splits},
                    {"head_groups", plan.head_groups},
                    {"cores_used", plan.cores_used},
                    {"combine", plan.combine}};
    const nlohmann::ordered_json details = sim::summary_json(summary);
    for (auto it = details.begin(); it != details.end(); ++it) json[it.key()] = it.value();
    std::cout << json.dump(2) << '\n';
  } else {
    std::cout << sim::format_table(summary, title + "\n" + plan_text(config, plan) + "\n");
  }
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

int run_sweep(const Options& options) {
  const sim::HwParams hw = load_hw(options);
  const sim::MlaConfig base = base_config(options, hw);
  const auto list = [&](const char* flag, const std::vector<int>& fallback) {
    const auto found = options.values.find(flag);
    return found == options.values.end() ? fallback : parse_list(flag, found->second);
  };
  const std::vector<int> batches = list("--batch", {1, 2, 4, 8, 16, 24, 48});
  const std::vector<int> kvs = list("--kv", {512, 2048, 4096});
  const std::vector<int> chunks = list("--chunk", {1, 2, 4});
  // Every configuration is validated before the first is simulated: a bad value fails fast.
  std::vector<sim::MlaConfig> configs;
  for (const int batch : batches) {
    for (const int kv : kvs) {
      for (const int chunk : chunks) {
        sim::MlaConfig config = base;
        config.batch = batch;
        config.kv = kv;
        config.chunk = chunk;
        validate_config(config, hw, options);
        configs.push_back(config);
      }
    }
  }
  // The CPU kernel's times for the same grid (--cpu), at --cpu-threads threads.
  CpuTimes cpu;
  const auto cpu_file = options.values.find("--cpu");
  if (cpu_file != options.values.end()) cpu = load_cpu_times(cpu_file->second);
  const auto threads_flag = options.values.find("--cpu-threads");
  if (threads_flag != options.values.end() && cpu.empty()) {
    throw UsageError("--cpu-threads needs --cpu");
  }
  const int cpu_threads =
      threads_flag == options.values.end() ? 2 : parse_int("--cpu-threads", threads_flag->second);
  const auto cpu_time = [&](int batch, int kv, int chunk) {
    const auto found = cpu.find({batch, kv, base.heads, chunk, cpu_threads});
    return found == cpu.end() ? -1.0 : found->second;
  };
  struct Row {
    int batch, kv, chunk;
    sim::Summary summary;
  };
  std::vector<Row> rows;
  const std::size_t total = configs.size();
  const bool tty = isatty(fileno(stderr)) != 0;
  const auto started = std::chrono::steady_clock::now();
  auto last_report = started;
  for (const sim::MlaConfig& config : configs) {
    const sim::Program program = sim::build_mla_program(config, hw);
    const sim::SimResult result = sim::simulate(program, hw);
    rows.push_back({config.batch, config.kv, config.chunk, sim::summarize(program, result, hw)});
    // Progress: live on a terminal, otherwise a line at most once a second.
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
  // Ratios are to chunk=1 of the same (batch, kv), or to the first chunk listed without it.
  const int reference_chunk =
      std::find(chunks.begin(), chunks.end(), 1) != chunks.end() ? 1 : chunks.front();
  const auto reference_time = [&](const Row& row) {
    for (const Row& other : rows) {
      if (other.batch == row.batch && other.kv == row.kv && other.chunk == reference_chunk) {
        return other.summary.time_us;
      }
    }
    return row.summary.time_us;
  };
  if (options.json) {
    nlohmann::ordered_json array = nlohmann::ordered_json::array();
    for (const Row& row : rows) {
      nlohmann::ordered_json item;
      item["batch"] = row.batch;
      item["kv"] = row.kv;
      item["chunk"] = row.chunk;
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
    return 0;
  }
  sim::MlaConfig shown = base;
  std::string header = sim::describe(shown);
  header = header.substr(header.find("heads"));
  header.replace(header.find(", chunk"), header.find(", opts") - header.find(", chunk"), "");
  std::printf("ditops-sim sweep: %s\n", header.c_str());
  std::printf("time in us; (xN) = time / time at chunk=%d; AIC/AIV = compute-pipe idle share\n\n",
              reference_chunk);
  if (!cpu.empty()) {
    std::printf("CPU: %s, %d thread(s), heads %d; ratio = time / time at chunk=%d\n\n",
                cpu_file->second.c_str(), cpu_threads, base.heads, reference_chunk);
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
      const Row& row = rows[i + c];
      std::printf("  | %11.2f  (x%.3f)  %5.1f%%   %5.1f%%", row.summary.time_us,
                  row.summary.time_us / reference_time(row), 100.0 * row.summary.bubbles[0].idle,
                  100.0 * row.summary.bubbles[1].idle);
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
  return 0;
}

int run_hw(const Options& options) {
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
    std::cout << kUsage;
    return 0;
  }
  try {
    const Options options = parse_args(argc, argv);
    if (options.command == "mla") return run_mla(options);
    if (options.command == "sweep") return run_sweep(options);
    return run_hw(options);
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
