// ditops-sim sweep: the MLA kernel over a (batch, kv, chunk) grid, beside the CPU kernel's
// times (--cpu).

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/hw.hpp"
#include "sim/mla.hpp"
#include "sim/program.hpp"
#include "sim/report.hpp"
#include "tools/bench_json.hpp"
#include "tools/ditops_sim/cli.hpp"
#include "tools/ditops_sim/commands.hpp"
#include "tools/ditops_sim/run.hpp"

namespace ditops::tools::sim_cli {
namespace {

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

}  // namespace

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

}  // namespace ditops::tools::sim_cli
