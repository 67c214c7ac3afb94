#pragma once
// The steps ditops-sim's commands share (run.cpp): choosing the model a run uses (--mode),
// simulating a program, and writing its output files and JSON.

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>

#include "sim/engine.hpp"
#include "sim/hw.hpp"
#include "sim/program.hpp"
#include "sim/report.hpp"
#include "tools/ditops_sim/cli.hpp"

namespace ditops::tools::sim_cli {

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
                       const std::string& description);

/// The report's line on the model that ran.
std::string mode_line(const ModeChoice& choice);

/// One simulated program and what the reports need of it.
struct Run {
  sim::Program program;
  sim::SimResult result;
  sim::Summary summary;
};

Run simulate(sim::Program program, const sim::HwParams& hw, bool record);

/// Output files (--trace, --csv, --svg) record the instruction times.
bool wants_files(const Options& options);

/// Writes an output file. An existing path that is not a regular file (a directory, a FIFO, a
/// device, a symbolic link) is refused: a report never writes through it.
void write_file(const std::string& flag, const std::string& path,
                const std::function<void(std::ostream&)>& writer);

/// --trace, --csv and --svg of one run.
void write_run_files(const Options& options, const Run& run, const sim::HwParams& hw,
                     const std::string& title);

/// One run's JSON object: `head` (config, plan) followed by the summary's fields.
void print_run_json(nlohmann::ordered_json head, const sim::Summary& summary);

}  // namespace ditops::tools::sim_cli
