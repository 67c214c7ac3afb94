#pragma once
// Reports of one simulation: a summary (pipe busy ratios, bubbles and what they waited on),
// its human table and JSON, a Chrome-trace JSON for Perfetto, an msprof-like
// PipeUtilization CSV and an SVG Gantt chart. Writers take a stream; nothing prints by itself.

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "sim/engine.hpp"
#include "sim/hw.hpp"
#include "sim/program.hpp"

namespace ditops::sim {

/// The seven pipe kinds reported: AIC.MTE2 AIC.MTE1 AIC.M AIC.FIX AIV.MTE2 AIV.V AIV.MTE3.
inline constexpr int kReportPipes = 7;
const char* report_pipe_name(int report_pipe) noexcept;

struct UnitBubbles {
  std::string unit;  // "AIC" or "AIV"
  std::string pipe;  // the unit's compute pipe: "M" or "V"
  double idle = 0;   // idle share of the makespan, mean over active cores
  std::vector<std::pair<std::string, double>> reasons;  // what the pipe waited on, descending
};

struct PipeSummary {
  std::string name;
  double busy = 0;        // share of the makespan, mean over active cores
  double blocked = 0;     // share blocked on waits
  double done = 0;        // share after the pipe's last instruction
  double contention = 0;  // share of busy time lost to shared L2/HBM bandwidth
  std::vector<std::pair<std::string, double>> waits;  // descending
};

struct BufferSummary {
  std::string name;
  double peak = 0;  // bytes, worst core
  double capacity = 0;
  int core = 0;  // where the peak occurred
};

struct Summary {
  double cycles = 0;
  double time_us = 0;
  double launch_us = 0;
  int cores = 0;         // cores in the program
  int active_cores = 0;  // cores that did any work
  std::uint64_t instructions = 0;
  double hbm_bytes = 0;
  double l2_bytes = 0;
  std::vector<PipeSummary> pipes;    // kReportPipes entries
  std::vector<UnitBubbles> bubbles;  // AIC, AIV
  std::vector<BufferSummary> buffers;
};

Summary summarize(const Program& program, const SimResult& result, const HwParams& hw);

/// Human-readable table; `title` lines are printed first.
std::string format_table(const Summary& summary, const std::string& title);

/// time_us, cycles, pipes (name -> busy ratio), bubbles (unit -> idle ratio) and the details.
nlohmann::ordered_json summary_json(const Summary& summary);

/// Needs a result simulated with EngineOptions::record_instructions.
void write_chrome_trace(std::ostream& out, const Program& program, const SimResult& result,
                        const HwParams& hw);
void write_pipe_csv(std::ostream& out, const Program& program, const SimResult& result,
                    const HwParams& hw);
void write_svg(std::ostream& out, const Program& program, const SimResult& result,
               const HwParams& hw, const std::string& title);

}  // namespace ditops::sim
