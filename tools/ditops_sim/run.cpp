// The steps ditops-sim's commands share: the model a run uses, the simulation, the output files.

#include "tools/ditops_sim/run.hpp"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <system_error>
#include <utility>

#include "sim/engine.hpp"
#include "sim/hw.hpp"
#include "sim/program.hpp"
#include "sim/report.hpp"
#include "tools/ditops_sim/cli.hpp"

namespace ditops::tools::sim_cli {
namespace {

/// Programs are refused above this many instructions unless --max-instructions raises it: the
/// simulator holds ~30 bytes per instruction (~1 GiB here; a --trace or --svg adds ~40 bytes of
/// timing record each), and a batch 4096, kv 1M, 1024-head run would need 3 TB.
constexpr int kDefaultMaxInstructions = 30'000'000;

}  // namespace

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

std::string mode_line(const ModeChoice& choice) {
  std::string text = choice.mode == sim::SimMode::coarse
                         ? "mode: coarse (one event per core, unit and stage; sim/README.md)"
                         : "mode: fine (every instruction)";
  if (!choice.reason.empty()) text += "; " + choice.reason;
  return text;
}

// ---- run
// -----------------------------------------------------------------------------------------

Run simulate(sim::Program program, const sim::HwParams& hw, bool record) {
  sim::EngineOptions engine_options;
  engine_options.record_instructions = record;
  Run run{std::move(program), {}, {}};
  run.result = sim::simulate(run.program, hw, engine_options);
  run.summary = sim::summarize(run.program, run.result, hw);
  return run;
}

bool wants_files(const Options& options) { return options.get("--trace") || options.get("--svg"); }

// ---- report
// --------------------------------------------------------------------------------------

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

void print_run_json(nlohmann::ordered_json head, const sim::Summary& summary) {
  const nlohmann::ordered_json details = sim::summary_json(summary);
  for (auto it = details.begin(); it != details.end(); ++it) head[it.key()] = it.value();
  std::cout << head.dump(2) << '\n';
}

}  // namespace ditops::tools::sim_cli
