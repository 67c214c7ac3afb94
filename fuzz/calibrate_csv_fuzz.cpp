// ditops-sim calibrate's measurement CSV parser (sim/calibrate.hpp parse_measurements, the one
// load_measurements runs on a file's text) on any text. Either SimError with the message the
// parser documents ("NAME: row R (line L), column C: problem", R and L within the text, C a
// column of the format; or no header / no rows), or rows that keep every promise: numbered 1..n
// on increasing lines, a finite positive value, one kind (times or speedups) throughout, a
// configuration (and base) the simulator accepts, switches that print back to themselves; and
// the rows written out as a canonical CSV parse back to the same rows.

#include <sanitizer/common_interface_defs.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "sim/calibrate.hpp"
#include "sim/error.hpp"
#include "sim/hw.hpp"
#include "sim/mla.hpp"

namespace {

using ditops::sim::MlaConfig;
using ditops::sim::MlaOptimizations;

[[noreturn]] void failure(const std::string& what) {
  __sanitizer_report_error_summary(("ditops fuzz: " + what).c_str());
  std::abort();
}

constexpr const char* kName = "fuzz.csv";

bool same_opts(const MlaOptimizations& a, const MlaOptimizations& b) {
  for (const ditops::sim::MlaOptInfo& info : ditops::sim::mla_opt_table()) {
    if (a.*info.field != b.*info.field) return false;
  }
  return true;
}

bool same_config(const MlaConfig& a, const MlaConfig& b) {
  return a.batch == b.batch && a.kv == b.kv && a.heads == b.heads && a.q_len == b.q_len &&
         a.cores == b.cores && a.block_size == b.block_size && a.chunk == b.chunk &&
         same_opts(a.opts, b.opts) && a.min_blocks_per_split == b.min_blocks_per_split &&
         a.max_rows_per_task == b.max_rows_per_task;
}

/// A switch list as a CSV cell: mla_opts_to_string joins with ',', the CSV with '+'.
std::string opt_cell(const MlaOptimizations& opts) {
  std::string text = ditops::sim::mla_opts_to_string(opts);
  std::replace(text.begin(), text.end(), ',', '+');
  return text;
}

/// The rows as a CSV with every column (values to 17 digits, which read back exactly).
std::string canonical_csv(const std::vector<ditops::sim::Measurement>& rows) {
  const bool speedup = rows.front().speedup;
  std::string text = "batch,kv,chunk,opt,heads,q_len,cores,block_size,";
  text += speedup ? "speedup,base_chunk,base_opt\n" : "time_us\n";
  for (const ditops::sim::Measurement& m : rows) {
    const MlaConfig& c = m.config;
    char value[40];
    std::snprintf(value, sizeof value, "%.17g", m.value);
    text += std::to_string(c.batch) + "," + std::to_string(c.kv) + "," + std::to_string(c.chunk) +
            "," + opt_cell(c.opts) + "," + std::to_string(c.heads) + "," + std::to_string(c.q_len) +
            "," + std::to_string(c.cores) + "," + std::to_string(c.block_size) + "," + value;
    if (speedup) text += "," + std::to_string(m.base.chunk) + "," + opt_cell(m.base.opts);
    text += "\n";
  }
  return text;
}

void check_rows(const std::vector<ditops::sim::Measurement>& rows, int lines,
                const ditops::sim::HwParams& hw) {
  if (rows.empty() || rows.size() > static_cast<std::size_t>(ditops::sim::kMaxMeasurements)) {
    failure("parse_measurements accepted " + std::to_string(rows.size()) + " rows");
  }
  int previous_line = 1;  // the header's line at the earliest
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const ditops::sim::Measurement& m = rows[i];
    const std::string where = "row " + std::to_string(i + 1) + ": ";
    if (m.row != static_cast<int>(i) + 1) failure(where + "numbered " + std::to_string(m.row));
    if (m.line <= previous_line || m.line > lines) {
      failure(where + "line " + std::to_string(m.line) + " after line " +
              std::to_string(previous_line) + " of " + std::to_string(lines));
    }
    previous_line = m.line;
    if (!std::isfinite(m.value) || !(m.value > 0)) {
      failure(where + "value " + std::to_string(m.value) + " is not finite and positive");
    }
    if (m.speedup != rows.front().speedup) failure(where + "times and speedups mixed");
    try {
      ditops::sim::validate(m.config, hw);
      if (m.speedup) ditops::sim::validate(m.base, hw);
    } catch (const ditops::sim::SimError& error) {
      failure(where + "accepted a configuration validate() refuses: " + error.what());
    }
    // The base is the row's configuration with its own chunk and switches.
    if (m.speedup) {
      MlaConfig base = m.base;
      base.chunk = m.config.chunk;
      base.opts = m.config.opts;
      if (!same_config(base, m.config)) failure(where + "the base differs beyond chunk and opt");
    }
    for (const MlaOptimizations* opts : {&m.config.opts, &m.base.opts}) {
      if (!same_opts(ditops::sim::parse_mla_opts(ditops::sim::mla_opts_to_string(*opts)), *opts)) {
        failure(where + "switches '" + ditops::sim::mla_opts_to_string(*opts) +
                "' do not read back");
      }
    }
  }
}

/// What a rejection must say: the parser's one-line format, with a row and line inside the text
/// and a column of the format ("-" for the row count).
void check_error(const std::string& message, int lines) {
  if (message == std::string(kName) + ": no header row" ||
      message == std::string(kName) + ": no measurement rows") {
    return;
  }
  static const std::regex format(std::string(kName) +
                                 R"(: row (\d+) \(line (\d+)\), column ([^:]*): [\s\S]+)");
  static const std::set<std::string> columns = {
      "batch",      "kv",      "chunk",   "opt",        "heads",    "q_len", "cores",
      "block_size", "time_us", "speedup", "base_chunk", "base_opt", "-"};
  std::smatch match;
  if (!std::regex_match(message, match, format)) {
    failure("SimError not in the documented format: " + message);
  }
  const long row = std::stol(match[1].str()), line = std::stol(match[2].str());
  // Data row R is on line R + 1 at the earliest (the header comes first, row 0).
  if (line < 1 || line > lines || row > line - 1) {
    failure("SimError names row " + std::to_string(row) + ", line " + std::to_string(line) +
            " of " + std::to_string(lines) + ": " + message);
  }
  if (columns.count(match[3].str()) == 0) failure("SimError names no column: " + message);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ditops::sim;
  const std::string text(reinterpret_cast<const char*>(data), size);
  // Lines as std::getline counts them: a last line without '\n' counts too.
  const int lines = static_cast<int>(std::count(text.begin(), text.end(), '\n')) +
                    (!text.empty() && text.back() != '\n' ? 1 : 0);
  const HwParams hw;
  std::vector<Measurement> rows;
  try {
    rows = parse_measurements(text, kName, hw);
  } catch (const SimError& error) {
    check_error(error.what(), lines);
    return 0;
  }
  check_rows(rows, lines, hw);
  const std::string canonical = canonical_csv(rows);
  std::vector<Measurement> again;
  try {
    again = parse_measurements(canonical, kName, hw);
  } catch (const SimError& error) {
    failure(std::string("the accepted rows written out are refused: ") + error.what());
  }
  if (again.size() != rows.size()) failure("the accepted rows written out read back resized");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Measurement &a = rows[i], &b = again[i];
    if (!same_config(a.config, b.config) || a.speedup != b.speedup || a.value != b.value ||
        (a.speedup && !same_config(a.base, b.base))) {
      failure("row " + std::to_string(i + 1) + " reads back differently from " + canonical);
    }
  }
  return 0;
}
