#include "sim/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>

namespace ditops::sim {
namespace {

// Report pipe -> local pipe indices (AIV pipes are averaged over both AIVs).
const std::vector<std::vector<int>>& report_pipe_locals() {
  static const std::vector<std::vector<int>> locals = {{0}, {1}, {2}, {3}, {4, 7}, {5, 8}, {6, 9}};
  return locals;
}

std::string percent(double ratio) {
  char text[32];
  std::snprintf(text, sizeof text, "%5.1f%%", 100.0 * ratio);
  return text;
}

std::string bytes_text(double bytes) {
  char text[32];
  if (bytes >= 1024.0 * 1024.0) {
    std::snprintf(text, sizeof text, "%.2f MiB", bytes / (1024.0 * 1024.0));
  } else {
    std::snprintf(text, sizeof text, "%.0f KiB", bytes / 1024.0);
  }
  return text;
}

std::vector<std::pair<std::string, double>> sorted(const std::map<std::string, double>& values) {
  std::vector<std::pair<std::string, double>> items(values.begin(), values.end());
  std::stable_sort(items.begin(), items.end(),
                   [](const auto& lhs, const auto& rhs) { return lhs.second > rhs.second; });
  return items;
}

// Waits are labeled "wait X ready"; the reason shown is X.
std::string reason_of(const Program& program, std::uint32_t label) {
  std::string text = program.labels[label];
  if (text.rfind("wait ", 0) == 0) text = text.substr(5);
  return text.empty() ? "(unnamed wait)" : text;
}

bool core_active(const SimResult& result, int core) {
  for (int local = 0; local < kPipesPerCore; ++local) {
    const PipeStats& stats = result.pipes[static_cast<std::size_t>(core) * kPipesPerCore + local];
    if (stats.busy > 0) return true;
  }
  return false;
}

std::vector<int> active_cores(const Program& program, const SimResult& result) {
  std::vector<int> cores;
  for (int core = 0; core < program.num_cores; ++core) {
    if (core_active(result, core)) cores.push_back(core);
  }
  return cores;
}

const char* stage_color(StageTag tag) {
  switch (tag) {
    case StageTag::setup:
      return "#9c9c9c";
    case StageTag::qk:
      return "#4e79a7";
    case StageTag::sm:
      return "#f28e2b";
    case StageTag::pv:
      return "#59a14f";
    case StageTag::up:
      return "#b07aa1";
    case StageTag::combine:
      return "#76b7b2";
    case StageTag::sync:
      return "#edc948";
  }
  return "#000000";
}

std::string xml_escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

const char* report_pipe_name(int report_pipe) noexcept {
  static constexpr const char* kNames[kReportPipes] = {"AIC.MTE2", "AIC.MTE1", "AIC.M",   "AIC.FIX",
                                                       "AIV.MTE2", "AIV.V",    "AIV.MTE3"};
  return report_pipe >= 0 && report_pipe < kReportPipes ? kNames[report_pipe] : "?";
}

Summary summarize(const Program& program, const SimResult& result, const HwParams& hw) {
  Summary summary;
  summary.cycles = result.makespan;
  summary.time_us = result.makespan / cycles_per_us(hw);
  summary.launch_us = hw.kernel_launch_us;
  summary.cores = program.num_cores;
  summary.instructions = result.instructions;
  summary.hbm_bytes = result.hbm_bytes;
  summary.l2_bytes = result.l2_bytes;
  const std::vector<int> cores = active_cores(program, result);
  summary.active_cores = static_cast<int>(cores.size());
  const double span = result.makespan > 0 ? result.makespan : 1.0;
  for (int report_pipe = 0; report_pipe < kReportPipes; ++report_pipe) {
    PipeSummary pipe;
    pipe.name = report_pipe_name(report_pipe);
    std::map<std::string, double> waits;
    double samples = 0;
    for (const int core : cores) {
      for (const int local : report_pipe_locals()[static_cast<std::size_t>(report_pipe)]) {
        const PipeStats& stats =
            result.pipes[static_cast<std::size_t>(core) * kPipesPerCore + local];
        pipe.busy += stats.busy / span;
        pipe.blocked += stats.blocked / span;
        pipe.done += stats.tail / span;
        pipe.contention += stats.contention / span;
        for (const auto& [label, cycles] : stats.blocked_by_label) {
          waits[reason_of(program, label)] += cycles / span;
        }
        samples += 1;
      }
    }
    if (samples > 0) {
      pipe.busy /= samples;
      pipe.blocked /= samples;
      pipe.done /= samples;
      pipe.contention /= samples;
      for (auto& [name, value] : waits) value /= samples;
    }
    pipe.waits = sorted(waits);
    summary.pipes.push_back(pipe);
  }
  // The compute pipes carry the work; their idle time is the pipeline bubble.
  for (const auto& [unit, report_pipe] : {std::pair<const char*, int>{"AIC", 2}, {"AIV", 5}}) {
    const PipeSummary& pipe = summary.pipes[static_cast<std::size_t>(report_pipe)];
    UnitBubbles bubbles;
    bubbles.unit = unit;
    bubbles.pipe = report_pipe == 2 ? "M" : "V";
    bubbles.idle = cores.empty() ? 0.0 : 1.0 - pipe.busy;
    bubbles.reasons = pipe.waits;
    if (pipe.done > 0) bubbles.reasons.emplace_back("finished early (tail)", pipe.done);
    std::stable_sort(bubbles.reasons.begin(), bubbles.reasons.end(),
                     [](const auto& lhs, const auto& rhs) { return lhs.second > rhs.second; });
    summary.bubbles.push_back(bubbles);
  }
  for (const Buffer buffer : {Buffer::l1, Buffer::l0a, Buffer::l0b, Buffer::l0c, Buffer::ub}) {
    BufferSummary entry;
    entry.name = buffer_name(buffer);
    entry.capacity = buffer_capacity(hw, buffer);
    for (int core = 0; core < program.num_cores; ++core) {
      for (int unit = 0; unit < kUnitsPerCore; ++unit) {
        const double peak =
            result
                .buffer_peak[(static_cast<std::size_t>(core) * kUnitsPerCore + unit) * kNumBuffers +
                             static_cast<std::size_t>(buffer)];
        if (peak > entry.peak) {
          entry.peak = peak;
          entry.core = core;
        }
      }
    }
    summary.buffers.push_back(entry);
  }
  return summary;
}

std::string format_table(const Summary& summary, const std::string& title) {
  std::ostringstream out;
  char line[256];
  out << title;
  if (!title.empty() && title.back() != '\n') out << '\n';
  std::snprintf(line, sizeof line,
                "time      %.3f us  (%.0f cycles; kernel launch ~%.0f us not included)\n",
                summary.time_us, summary.cycles, summary.launch_us);
  out << line;
  std::snprintf(line, sizeof line,
                "work      %llu instructions on %d of %d cores; HBM read %s, L2 "
                "traffic %s\n\n",
                static_cast<unsigned long long>(summary.instructions), summary.active_cores,
                summary.cores, bytes_text(summary.hbm_bytes).c_str(),
                bytes_text(summary.l2_bytes).c_str());
  out << line;
  out << "pipe       busy    blocked  done    contention  top waits (share of time)\n";
  for (const PipeSummary& pipe : summary.pipes) {
    std::string waits;
    for (std::size_t i = 0; i < pipe.waits.size() && i < 3; ++i) {
      if (pipe.waits[i].second < 0.0005) break;
      waits += (i ? ", " : "") + pipe.waits[i].first + " " + percent(pipe.waits[i].second);
    }
    std::snprintf(line, sizeof line, "%-9s %s  %s  %s  %s      %s\n", pipe.name.c_str(),
                  percent(pipe.busy).c_str(), percent(pipe.blocked).c_str(),
                  percent(pipe.done).c_str(), percent(pipe.contention).c_str(), waits.c_str());
    out << line;
  }
  out << "\nbubbles (compute-pipe idle share, mean over " << summary.active_cores
      << " active cores)\n";
  for (const UnitBubbles& unit : summary.bubbles) {
    std::string reasons;
    for (std::size_t i = 0; i < unit.reasons.size() && i < 4; ++i) {
      if (unit.reasons[i].second < 0.0005) break;
      reasons += (i ? ", " : "") + unit.reasons[i].first + " " + percent(unit.reasons[i].second);
    }
    std::snprintf(line, sizeof line, "%-3s (%s)  idle %s  waiting on: %s\n", unit.unit.c_str(),
                  unit.pipe.c_str(), percent(unit.idle).c_str(), reasons.c_str());
    out << line;
  }
  out << "\nbuffers (peak / capacity, worst core)\n";
  for (const BufferSummary& buffer : summary.buffers) {
    std::snprintf(line, sizeof line, "%-4s %s / %s (core %d)\n", buffer.name.c_str(),
                  bytes_text(buffer.peak).c_str(), bytes_text(buffer.capacity).c_str(),
                  buffer.core);
    out << line;
  }
  return out.str();
}

nlohmann::ordered_json summary_json(const Summary& summary) {
  nlohmann::ordered_json json;
  json["time_us"] = summary.time_us;
  json["cycles"] = summary.cycles;
  json["launch_us"] = summary.launch_us;
  json["instructions"] = summary.instructions;
  json["cores"] = summary.cores;
  json["active_cores"] = summary.active_cores;
  json["hbm_bytes"] = summary.hbm_bytes;
  json["l2_bytes"] = summary.l2_bytes;
  nlohmann::ordered_json pipes = nlohmann::ordered_json::object();
  nlohmann::ordered_json details = nlohmann::ordered_json::object();
  for (const PipeSummary& pipe : summary.pipes) {
    pipes[pipe.name] = pipe.busy;
    nlohmann::ordered_json waits = nlohmann::ordered_json::object();
    for (const auto& [name, value] : pipe.waits) waits[name] = value;
    details[pipe.name] = {{"busy", pipe.busy},
                          {"blocked", pipe.blocked},
                          {"done", pipe.done},
                          {"contention", pipe.contention},
                          {"waits", waits}};
  }
  json["pipes"] = pipes;
  nlohmann::ordered_json bubbles = nlohmann::ordered_json::object();
  nlohmann::ordered_json reasons = nlohmann::ordered_json::object();
  for (const UnitBubbles& unit : summary.bubbles) {
    bubbles[unit.unit] = unit.idle;
    nlohmann::ordered_json list = nlohmann::ordered_json::object();
    for (const auto& [name, value] : unit.reasons) list[name] = value;
    reasons[unit.unit] = list;
  }
  json["bubbles"] = bubbles;
  json["bubble_reasons"] = reasons;
  json["pipe_details"] = details;
  nlohmann::ordered_json buffers = nlohmann::ordered_json::object();
  for (const BufferSummary& buffer : summary.buffers) {
    buffers[buffer.name] = {
        {"peak_bytes", buffer.peak}, {"capacity_bytes", buffer.capacity}, {"core", buffer.core}};
  }
  json["buffers"] = buffers;
  return json;
}

namespace {

// Chrome trace: zero-length sets and waits last 1 ns, so they stay visible and bindable.
constexpr double kTraceTinyUs = 0.001;

/// The trace's process (core) and thread (pipe) names and orders, for the cores shown.
void append_trace_names(nlohmann::json& events, const Program& program,
                        const std::vector<bool>& shown) {
  for (int core = 0; core < program.num_cores; ++core) {
    if (!shown[static_cast<std::size_t>(core)]) continue;
    events.push_back({{"ph", "M"},
                      {"name", "process_name"},
                      {"pid", core},
                      {"tid", 0},
                      {"args", {{"name", "core " + std::to_string(core)}}}});
    events.push_back({{"ph", "M"},
                      {"name", "process_sort_index"},
                      {"pid", core},
                      {"tid", 0},
                      {"args", {{"sort_index", core}}}});
    for (int local = 0; local < kPipesPerCore; ++local) {
      events.push_back({{"ph", "M"},
                        {"name", "thread_name"},
                        {"pid", core},
                        {"tid", local},
                        {"args", {{"name", local_pipe_name(local)}}}});
      events.push_back({{"ph", "M"},
                        {"name", "thread_sort_index"},
                        {"pid", core},
                        {"tid", local},
                        {"args", {{"sort_index", local}}}});
    }
  }
}

/// "s"/"f" flow events linking each cross-core set to the wait it released.
void append_trace_flows(nlohmann::json& events, const Program& program, const SimResult& result,
                        double per_us) {
  // Both ends inside the (at least kTraceTinyUs long) events they bind to.
  const auto bound_at = [&](std::uint32_t index) {
    const InstrRecord& record = result.records[index];
    return std::max(record.end / per_us, record.start / per_us + kTraceTinyUs) - kTraceTinyUs / 2;
  };
  std::uint64_t flow_id = 0;
  for (const auto& [set, wait] : result.cross_flows) {
    if (set == kNoInstr) continue;
    const PackedInstr& from = program.instrs[set];
    const PackedInstr& to = program.instrs[wait];
    ++flow_id;
    events.push_back({{"ph", "s"},
                      {"name", program.labels[from.label]},
                      {"cat", "flag"},
                      {"id", flow_id},
                      {"pid", from.core},
                      {"tid", local_pipe_index(from.unit, from.pipe)},
                      {"ts", bound_at(set)}});
    events.push_back({{"ph", "f"},
                      {"bp", "e"},
                      {"name", program.labels[from.label]},
                      {"cat", "flag"},
                      {"id", flow_id},
                      {"pid", to.core},
                      {"tid", local_pipe_index(to.unit, to.pipe)},
                      {"ts", bound_at(wait)}});
  }
}

}  // namespace

void write_chrome_trace(std::ostream& out, const Program& program, const SimResult& result,
                        const HwParams& hw) {
  // Chrome trace event format: ts/dur in microseconds; one process per core, one thread per
  // pipe; "s"/"f" flow events link a cross-core set to the wait it released.
  const double per_us = cycles_per_us(hw);
  nlohmann::json events = nlohmann::json::array();
  const std::vector<int> cores = active_cores(program, result);
  std::vector<bool> shown(static_cast<std::size_t>(program.num_cores), false);
  for (const int core : cores) shown[static_cast<std::size_t>(core)] = true;
  // Cores that only joined a barrier still show when a flow touches them.
  for (const auto& [set, wait] : result.cross_flows) {
    if (set != kNoInstr) shown[static_cast<std::size_t>(program.instrs[set].core)] = true;
    shown[static_cast<std::size_t>(program.instrs[wait].core)] = true;
  }
  append_trace_names(events, program, shown);
  if (result.records.size() != program.instrs.size()) {
    out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ns"}}.dump() << '\n';
    return;
  }
  for (std::uint32_t index = 0; index < program.instrs.size(); ++index) {
    const PackedInstr& instr = program.instrs[index];
    if (!shown[static_cast<std::size_t>(instr.core)]) continue;
    const InstrRecord& record = result.records[index];
    const int tid = local_pipe_index(instr.unit, instr.pipe);
    const bool work = instr.op == Op::compute || instr.op == Op::gm_read ||
                      instr.op == Op::gm_write || instr.op == Op::stage;
    // Work shows the time it held its pipe; waits and sets span until they took effect.
    const double start = record.start / per_us;
    double duration = ((work ? record.release : record.end) - record.start) / per_us;
    std::string name = program.labels[instr.label];
    std::string category = stage_tag_name(instr.stage);
    nlohmann::json args = nlohmann::json::object();
    if (instr.block >= 0) args["block"] = instr.block;
    switch (instr.op) {
      case Op::compute:
        break;
      case Op::gm_read:
      case Op::gm_write:
      case Op::stage:
        args["bytes"] = program.cost(instr).bytes;
        args["ideal_us"] = program.cost(instr).ideal_cycles / per_us;
        args["data_landed_us"] = record.end / per_us;
        break;
      case Op::wait_event:
      case Op::wait_cross:
        if (record.end <= record.start && instr.op == Op::wait_event) continue;
        category = "bubble";
        name = "wait " + reason_of(program, instr.label);
        break;
      case Op::set_event:
        continue;  // intra-core sets would only clutter the lanes
      case Op::set_cross:
        name = "set " + program.labels[instr.label];
        category = "flag";
        break;
    }
    duration = std::max(duration, kTraceTinyUs);
    events.push_back({{"ph", "X"},
                      {"name", name},
                      {"cat", category},
                      {"pid", instr.core},
                      {"tid", tid},
                      {"ts", start},
                      {"dur", duration},
                      {"args", args}});
  }
  append_trace_flows(events, program, result, per_us);
  out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ns"}}.dump() << '\n';
}

void write_pipe_csv(std::ostream& out, const Program& program, const SimResult& result,
                    const HwParams& hw) {
  // Columns follow msprof's PipeUtilization.csv (aic_* for the cube core, aiv_* for the vector
  // cores, averaged over the two AIVs), one row per active core and a mean row.
  const double per_us = cycles_per_us(hw);
  const double span = result.makespan > 0 ? result.makespan : 1.0;
  out << "core_id,aic_total_time(us),aic_total_cycles,aic_mac_time(us),aic_mac_ratio,"
         "aic_mte1_time(us),aic_mte1_ratio,aic_mte2_time(us),aic_mte2_ratio,"
         "aic_fixpipe_time(us),aic_fixpipe_ratio,aiv_total_time(us),aiv_total_cycles,"
         "aiv_vec_time(us),aiv_vec_ratio,aiv_mte2_time(us),aiv_mte2_ratio,aiv_mte3_time(us),"
         "aiv_mte3_ratio\n";
  const std::vector<int> cores = active_cores(program, result);
  // Busy cycles per report pipe in the CSV's column order.
  static const int kAicOrder[] = {2, 1, 0, 3};
  static const int kAivOrder[] = {5, 4, 6};
  std::vector<double> mean(7, 0.0);
  char cell[64];
  const auto write_row = [&](const std::string& name, const std::vector<double>& busy) {
    out << name;
    std::snprintf(cell, sizeof cell, ",%.3f,%.0f", span / per_us, span);
    out << cell;
    for (const int pipe : kAicOrder) {
      std::snprintf(cell, sizeof cell, ",%.3f,%.4f", busy[static_cast<std::size_t>(pipe)] / per_us,
                    busy[static_cast<std::size_t>(pipe)] / span);
      out << cell;
    }
    std::snprintf(cell, sizeof cell, ",%.3f,%.0f", span / per_us, span);
    out << cell;
    for (const int pipe : kAivOrder) {
      std::snprintf(cell, sizeof cell, ",%.3f,%.4f", busy[static_cast<std::size_t>(pipe)] / per_us,
                    busy[static_cast<std::size_t>(pipe)] / span);
      out << cell;
    }
    out << '\n';
  };
  for (const int core : cores) {
    std::vector<double> busy(7, 0.0);
    for (int report_pipe = 0; report_pipe < kReportPipes; ++report_pipe) {
      const auto& locals = report_pipe_locals()[static_cast<std::size_t>(report_pipe)];
      for (const int local : locals) {
        busy[static_cast<std::size_t>(report_pipe)] +=
            result.pipes[static_cast<std::size_t>(core) * kPipesPerCore + local].busy /
            static_cast<double>(locals.size());
      }
      mean[static_cast<std::size_t>(report_pipe)] +=
          busy[static_cast<std::size_t>(report_pipe)] / static_cast<double>(cores.size());
    }
    write_row(std::to_string(core), busy);
  }
  if (!cores.empty()) write_row("mean", mean);
}

namespace {

// The SVG chart's label column and plot widths (pixels).
constexpr double kLabelWidth = 96;
constexpr double kPlotWidth = 1400;

/// The stage colors and the bubble pattern, in a row under the title.
void write_svg_legend(std::ostream& out) {
  char buffer[512];
  double legend_x = 8;
  for (const StageTag tag : {StageTag::qk, StageTag::sm, StageTag::pv, StageTag::up,
                             StageTag::combine, StageTag::setup}) {
    std::snprintf(buffer, sizeof buffer,
                  "<rect x=\"%.0f\" y=\"40\" width=\"12\" height=\"10\" fill=\"%s\"/><text "
                  "x=\"%.0f\" y=\"49\">%s</text>\n",
                  legend_x, stage_color(tag), legend_x + 16, stage_tag_name(tag));
    out << buffer;
    legend_x += 74;
  }
  std::snprintf(buffer, sizeof buffer,
                "<rect x=\"%.0f\" y=\"40\" width=\"12\" height=\"10\" fill=\"url(#bubble)\" "
                "stroke=\"#e15759\" stroke-width=\"0.5\"/><text x=\"%.0f\" y=\"49\">bubble "
                "(blocked on a wait; hover for the flag)</text>\n",
                legend_x, legend_x + 16);
  out << buffer;
}

/// The time axis under the plot (at plot_bottom), ticks of 1, 2 or 5 x 10^k us.
void write_time_axis(std::ostream& out, double total_us, double x_per_us, double plot_bottom) {
  char buffer[512];
  const double raw_step = total_us / 10.0;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw_step > 0 ? raw_step : 1.0)));
  double step = magnitude;
  for (const double factor : {1.0, 2.0, 5.0, 10.0}) {
    if (magnitude * factor >= raw_step) {
      step = magnitude * factor;
      break;
    }
  }
  std::snprintf(buffer, sizeof buffer,
                "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"black\"/>\n",
                kLabelWidth, plot_bottom, kLabelWidth + kPlotWidth, plot_bottom);
  out << buffer;
  for (double tick = 0; tick <= total_us * 1.0001; tick += step) {
    const double x = kLabelWidth + tick * x_per_us;
    std::snprintf(buffer, sizeof buffer,
                  "<line x1=\"%.2f\" y1=\"%.1f\" x2=\"%.2f\" y2=\"%.1f\" stroke=\"black\"/><text "
                  "x=\"%.2f\" y=\"%.1f\" text-anchor=\"middle\">%g</text>\n",
                  x, plot_bottom, x, plot_bottom + 5, x, plot_bottom + 17, tick);
    out << buffer;
  }
  std::snprintf(buffer, sizeof buffer,
                "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"middle\">time (us)</text>\n",
                kLabelWidth + kPlotWidth / 2, plot_bottom + 33);
  out << buffer;
}

}  // namespace

void write_svg(std::ostream& out, const Program& program, const SimResult& result,
               const HwParams& hw, const std::string& title) {
  constexpr int kMaxCores = 32;  // beyond this the chart stops being readable
  constexpr double kRowHeight = 11;
  constexpr double kCoreGap = 9;
  constexpr double kTop = 64;
  const double per_us = cycles_per_us(hw);
  const std::vector<int> all_cores = active_cores(program, result);
  const std::vector<int> cores(
      all_cores.begin(), all_cores.begin() + std::min<std::size_t>(all_cores.size(), kMaxCores));
  std::vector<int> row_of_core(static_cast<std::size_t>(program.num_cores), -1);
  for (std::size_t i = 0; i < cores.size(); ++i) {
    row_of_core[static_cast<std::size_t>(cores[i])] = static_cast<int>(i);
  }
  const double span = result.makespan > 0 ? result.makespan : 1.0;
  const double scale = kPlotWidth / span;
  const auto core_top = [&](int index) {
    return kTop + index * (kPipesPerCore * kRowHeight + kCoreGap);
  };
  const double plot_bottom = core_top(static_cast<int>(cores.size()));
  const double height = plot_bottom + 48;
  const double width = kLabelWidth + kPlotWidth + 20;
  char buffer[512];
  std::snprintf(buffer, sizeof buffer,
                "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                "font-family=\"sans-serif\" font-size=\"10\">\n",
                width, height);
  out << buffer;
  out << "<defs><pattern id=\"bubble\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" "
         "patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"#fde0e0\"/>"
         "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"#e15759\" stroke-width=\"2\"/>"
         "</pattern></defs>\n";
  out << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::snprintf(buffer, sizeof buffer,
                "<text x=\"8\" y=\"16\" font-size=\"13\" font-weight=\"bold\">%s</text>\n",
                xml_escape(title).c_str());
  out << buffer;
  std::snprintf(
      buffer, sizeof buffer,
      "<text x=\"8\" y=\"32\">total %.3f us (%.0f cycles); %zu of %d cores shown%s</text>\n",
      result.makespan / per_us, result.makespan, cores.size(), program.num_cores,
      all_cores.size() > cores.size() ? " (more active cores not drawn)" : "");
  out << buffer;
  write_svg_legend(out);
  // Lane labels and guides.
  for (std::size_t i = 0; i < cores.size(); ++i) {
    for (int local = 0; local < kPipesPerCore; ++local) {
      const double y = core_top(static_cast<int>(i)) + local * kRowHeight;
      std::snprintf(buffer, sizeof buffer,
                    "<text x=\"4\" y=\"%.1f\" font-size=\"8\">c%d %s</text><rect x=\"%.0f\" "
                    "y=\"%.1f\" width=\"%.0f\" height=\"%.1f\" fill=\"%s\"/>\n",
                    y + kRowHeight - 2.5, cores[i], local_pipe_name(local).c_str(), kLabelWidth, y,
                    kPlotWidth, kRowHeight, local % 2 == 0 ? "#f7f7f7" : "#efefef");
      out << buffer;
    }
  }
  // Instructions and bubbles.
  const bool have_records = result.records.size() == program.instrs.size();
  for (std::uint32_t index = 0; have_records && index < program.instrs.size(); ++index) {
    const PackedInstr& instr = program.instrs[index];
    const int row = row_of_core[static_cast<std::size_t>(instr.core)];
    if (row < 0) continue;
    const InstrRecord& record = result.records[index];
    const bool wait = instr.op == Op::wait_event || instr.op == Op::wait_cross;
    const bool work = instr.op == Op::compute || instr.op == Op::gm_read ||
                      instr.op == Op::gm_write || instr.op == Op::stage;
    const double end = work ? record.release : record.end;
    if (!(wait || work) || end <= record.start) continue;
    const double x = kLabelWidth + record.start * scale;
    const double w = std::max(0.4, (end - record.start) * scale);
    const double y = core_top(row) + local_pipe_index(instr.unit, instr.pipe) * kRowHeight + 1;
    std::string tip = program.labels[instr.label];
    if (instr.block >= 0) tip += " (block " + std::to_string(instr.block) + ")";
    std::snprintf(buffer, sizeof buffer,
                  "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"><title>"
                  "%s: %.3f-%.3f us</title></rect>\n",
                  x, y, w, kRowHeight - 2, wait ? "url(#bubble)" : stage_color(instr.stage),
                  xml_escape(tip).c_str(), record.start / per_us, end / per_us);
    out << buffer;
  }
  write_time_axis(out, span / per_us, per_us * scale, plot_bottom);
  out << "</svg>\n";
}

}  // namespace ditops::sim
