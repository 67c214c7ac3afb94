#include "sim/calibrate.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <map>
#include <sstream>
#include <thread>

#include "ops/core/file.hpp"
#include "sim/engine.hpp"
#include "sim/error.hpp"
#include "sim/report.hpp"

namespace ditops::sim {
namespace {

// A program larger than this per row is refused: calibration simulates every row many times.
constexpr std::uint64_t kMaxRowInstructions = 10'000'000;

// Levenberg-Marquardt settings: log-parameter step of the forward differences, iterations,
// damping tries per iteration and the relative improvement below which the fit stops.
constexpr double kDifferenceStep = 0.05;
constexpr int kMaxIterations = 12;
constexpr int kMaxDampingTries = 6;
constexpr double kMaxStep = 0.5;  // per parameter and iteration, in log space (a trust region)
constexpr double kMinImprovement = 1e-3;
constexpr double kBound = 1.3862943611198906;  // ln 4

std::vector<std::string> split(const std::string& line, char separator) {
  std::vector<std::string> cells;
  std::stringstream stream(line);
  std::string cell;
  while (std::getline(stream, cell, separator)) {
    const auto first = cell.find_first_not_of(" \t\r");
    const auto last = cell.find_last_not_of(" \t\r");
    cells.push_back(first == std::string::npos ? "" : cell.substr(first, last - first + 1));
  }
  if (!line.empty() && line.back() == separator) cells.emplace_back();
  return cells;
}

double time_us(const MlaConfig& config, const HwParams& hw) {
  const Program program = build_mla_program(config, hw);
  return summarize(program, simulate(program, hw), hw).time_us;
}

double time_us(const FaConfig& config, const HwParams& hw) {
  const Program program = build_fa_program(config, hw);
  return summarize(program, simulate(program, hw), hw).time_us;
}

/// One configuration a measurement names (its own or its base's), MLA or flash attention.
struct Simulated {
  const Measurement* row;
  bool base;
  std::string key() const {
    if (row->flash) return "fa: " + describe(base ? row->fa_base : row->fa);
    return "mla: " + describe(base ? row->base : row->config);
  }
  double time(const HwParams& hw) const {
    const double launch = row->includes_launch ? hw.kernel_launch_us : 0.0;
    if (row->flash) return time_us(base ? row->fa_base : row->fa, hw) + launch;
    return time_us(base ? row->base : row->config, hw) + launch;
  }
};

}  // namespace

// Every distinct configuration of `rows` simulated once, in `threads` threads.
std::vector<double> predict_rows(const std::vector<Measurement>& rows, const HwParams& hw,
                                 int threads) {
  std::map<std::string, std::size_t> index;
  std::vector<Simulated> configs;
  const auto add = [&](const Simulated& config) {
    if (index.emplace(config.key(), configs.size()).second) configs.push_back(config);
  };
  for (const Measurement& row : rows) {
    add({&row, false});
    if (row.speedup) add({&row, true});
  }
  std::vector<double> times(configs.size());
  std::atomic<std::size_t> next{0};
  // A simulation error (a deadlock or overflow under the trial parameters) is rethrown here,
  // after every thread has stopped: the first one by configuration order, deterministically.
  std::vector<std::exception_ptr> errors(configs.size());
  const auto work = [&] {
    for (std::size_t i = next++; i < configs.size(); i = next++) {
      try {
        times[i] = configs[i].time(hw);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& thread : pool) thread.join();
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  std::vector<double> values;
  for (const Measurement& row : rows) {
    const double time = times[index[Simulated{&row, false}.key()]];
    values.push_back(row.speedup ? times[index[Simulated{&row, true}.key()]] / time : time);
  }
  return values;
}

namespace {

std::vector<double> residuals(const std::vector<Measurement>& rows,
                              const std::vector<double>& predicted) {
  std::vector<double> r;
  for (std::size_t i = 0; i < rows.size(); ++i) r.push_back(std::log(predicted[i] / rows[i].value));
  return r;
}

double rms(const std::vector<double>& r) {
  double sum = 0;
  for (const double value : r) sum += value * value;
  return r.empty() ? 0 : std::sqrt(sum / static_cast<double>(r.size()));
}

double squared(const std::vector<double>& r) {
  double sum = 0;
  for (const double value : r) sum += value * value;
  return sum;
}

/// Solves the symmetric positive definite system a x = b (n small) by Cholesky.
std::vector<double> solve_spd(std::vector<std::vector<double>> a, std::vector<double> b) {
  const std::size_t n = b.size();
  for (std::size_t j = 0; j < n; ++j) {
    double d = a[j][j];
    for (std::size_t k = 0; k < j; ++k) d -= a[j][k] * a[j][k];
    a[j][j] = std::sqrt(std::max(d, 1e-300));
    for (std::size_t i = j + 1; i < n; ++i) {
      double s = a[i][j];
      for (std::size_t k = 0; k < j; ++k) s -= a[i][k] * a[j][k];
      a[i][j] = s / a[j][j];
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t k = 0; k < i; ++k) b[i] -= a[i][k] * b[k];
    b[i] /= a[i][i];
  }
  for (std::size_t i = n; i-- > 0;) {
    for (std::size_t k = i + 1; k < n; ++k) b[i] -= a[k][i] * b[k];
    b[i] /= a[i][i];
  }
  return b;
}

struct Bounds {
  double low, high;  // in log space, relative to the start
};

/// The parameter `name` of the table, checked to be fittable from `start` and not among
/// `chosen` already.
const HwParamInfo* fittable_param(const std::string& name, const HwParams& start,
                                  const std::vector<const HwParamInfo*>& chosen) {
  const HwParamInfo* info = find_hw_param(name);
  if (info == nullptr) throw SimError("unknown hardware parameter '" + name + "'");
  if (std::find(chosen.begin(), chosen.end(), info) != chosen.end()) {
    throw SimError("parameter '" + name + "' named twice");
  }
  if (!(start.*info->field > 0))
    throw SimError("cannot fit " + name + " from a starting value of 0");
  if (info->integer) throw SimError(name + " is a count, not a fittable rate or latency");
  return info;
}

/// [1/4, 4] x the start, inside the parameter's range, in log space relative to the start.
Bounds fit_bounds(const HwParamInfo& info, double start) {
  return {std::max(-kBound, std::log(std::max(info.min, 1e-300) / start)),
          std::min(kBound, std::log(info.max / start))};
}

using Matrix = std::vector<std::vector<double>>;

/// The normal matrix J^T J of a Jacobian [rows][n].
Matrix normal_matrix(const Matrix& jacobian, std::size_t n) {
  Matrix normal(n, std::vector<double>(n, 0.0));
  for (const std::vector<double>& row : jacobian) {
    for (std::size_t a = 0; a < n; ++a) {
      for (std::size_t b = 0; b < n; ++b) normal[a][b] += row[a] * row[b];
    }
  }
  return normal;
}

/// Broyden's rank-one update of the Jacobian for the step from x to x_new, which moved the
/// residuals from r to r_new: J += (r_new - r - J s) s^T / (s^T s), s = x_new - x.
void broyden_update(Matrix& jacobian, const std::vector<double>& x,
                    const std::vector<double>& x_new, const std::vector<double>& r,
                    const std::vector<double>& r_new) {
  const std::size_t n = x.size();
  std::vector<double> s(n);
  double ss = 0;
  for (std::size_t a = 0; a < n; ++a) {
    s[a] = x_new[a] - x[a];
    ss += s[a] * s[a];
  }
  for (std::size_t j = 0; j < jacobian.size() && ss > 0; ++j) {
    double predicted_change = 0;
    for (std::size_t a = 0; a < n; ++a) predicted_change += jacobian[j][a] * s[a];
    const double miss = r_new[j] - r[j] - predicted_change;
    for (std::size_t a = 0; a < n; ++a) jacobian[j][a] += miss * s[a] / ss;
  }
}

/// Leave-one-out residuals from the leverages h_jj = J_j (J^T J)^-1 J_j^T of the last
/// linearization: the residual a fit without row j would leave there, to first order.
std::vector<double> held_out_residuals(const Matrix& jacobian, const std::vector<double>& r,
                                       std::size_t n) {
  Matrix normal = normal_matrix(jacobian, n);
  for (std::size_t a = 0; a < n; ++a) normal[a][a] += 1e-9;
  std::vector<double> held_out;
  for (std::size_t j = 0; j < jacobian.size(); ++j) {
    double leverage = 0;
    if (n > 0) {
      const std::vector<double> solved = solve_spd(normal, jacobian[j]);
      for (std::size_t a = 0; a < n; ++a) leverage += jacobian[j][a] * solved[a];
    }
    held_out.push_back(r[j] / std::max(1.0 - leverage, 1e-3));
  }
  return held_out;
}

/// The cells of one data row, read by column name; every problem names the file, the row, its
/// line and the column.
class RowReader {
 public:
  RowReader(const std::string& name, const std::map<std::string, std::size_t>& columns,
            std::vector<std::string> cells, int row, int line)
      : name_(name), columns_(columns), cells_(std::move(cells)), row_(row), line_(line) {}

  [[noreturn]] void fail(const std::string& column, const std::string& problem) const {
    throw SimError(name_ + ": row " + std::to_string(row_) + " (line " + std::to_string(line_) +
                   "), column " + column + ": " + problem);
  }
  bool has(const std::string& column) const { return columns_.count(column) != 0; }
  std::string cell(const std::string& column) const {
    const std::size_t at = columns_.at(column);
    if (at >= cells_.size() || cells_[at].empty()) fail(column, "is empty");
    return cells_[at];
  }
  /// Sets `target` from an optional column.
  void integer(const char* column, int& target) const {
    if (!has(column)) return;
    const std::string value = cell(column);
    if (value.size() > 9 || value.find_first_not_of("0123456789") != std::string::npos) {
      fail(column, "'" + value + "' is not a positive integer");
    }
    target = std::stoi(value);
  }
  double number(const char* column) const {
    const std::string value = cell(column);
    char* end = nullptr;
    const double parsed = std::strtod(value.c_str(), &end);
    if (end != value.c_str() + value.size() || !std::isfinite(parsed) || !(parsed > 0)) {
      fail(column, "'" + value + "' is not a positive number");
    }
    return parsed;
  }
  MlaOptimizations opts(const char* column) const {
    std::string value = cell(column);
    std::replace(value.begin(), value.end(), '+', ',');
    try {
      return parse_mla_opts(value);
    } catch (const SimError& error) {
      fail(column, error.what());
    }
  }
  /// One of `choices` (the column is optional: `fallback` when it is missing).
  std::string word(const char* column, const std::vector<std::string>& choices,
                   const std::string& fallback) const {
    if (!has(column)) return fallback;
    const std::string value = cell(column);
    if (std::find(choices.begin(), choices.end(), value) == choices.end()) {
      std::string known;
      for (const std::string& choice : choices) known += (known.empty() ? "" : " or ") + choice;
      fail(column, "'" + value + "' is not " + known);
    }
    return value;
  }
  /// Validates a configuration, blaming the column its error message starts with ("batch must
  /// be ...", "kv-seq ...": the field, with '-' for '_'); `chunk_column` stands for chunk.
  /// `instructions` estimates the program's size once the configuration is valid; a program too
  /// large to simulate many times is blamed on `size_column`.
  template <typename Config, typename Estimate>
  void check(const Config& config, const HwParams& hw, const char* chunk_column,
             const Estimate& instructions, const char* size_column) const {
    try {
      validate(config, hw);
    } catch (const SimError& error) {
      std::string field = error.what();
      field = field.substr(0, field.find(' '));
      std::replace(field.begin(), field.end(), '-', '_');
      if (field == "chunk") field = chunk_column;
      fail(field, error.what());
    }
    if (instructions(config, hw) > kMaxRowInstructions) {
      fail(size_column, describe(config) + " is too large to calibrate on");
    }
  }

 private:
  const std::string& name_;
  const std::map<std::string, std::size_t>& columns_;
  std::vector<std::string> cells_;
  int row_, line_;
};

/// The header's columns by name, checked: chunk and opt always, batch and kv unless a kernel
/// column lets rows be flash attention (an MLA row then checks them), and time_us or speedup.
std::map<std::string, std::size_t> header_columns(const std::vector<std::string>& cells,
                                                  const RowReader& header) {
  std::map<std::string, std::size_t> columns;
  for (std::size_t i = 0; i < cells.size(); ++i) columns[cells[i]] = i;
  const bool kernels = columns.count("kernel") != 0;
  for (const char* required : {"batch", "kv", "chunk", "opt"}) {
    const bool mla_only = std::string(required) == "batch" || std::string(required) == "kv";
    if (columns.count(required) == 0 && !(kernels && mla_only)) {
      header.fail(required, "missing in the header");
    }
  }
  const bool time = columns.count("time_us") != 0;
  const bool speedup = columns.count("speedup") != 0;
  if (time == speedup) {
    header.fail(time ? "speedup" : "time_us", "the header needs exactly one of time_us or speedup");
  }
  if (speedup) {
    for (const char* required : {"base_chunk", "base_opt"}) {
      if (columns.count(required) == 0) {
        header.fail(required, "missing in the header (needed with speedup)");
      }
    }
    if (columns.count("series") != 0) header.fail("series", "needs time_us, not speedup");
  }
  return columns;
}

/// An MLA row's configuration (and its speedup base).
void read_mla_row(const RowReader& reader, const HwParams& hw, Measurement& m) {
  for (const char* required : {"batch", "kv"}) {
    if (!reader.has(required)) reader.fail(required, "missing in the header (an mla row needs it)");
  }
  m.config.cores = std::min(static_cast<int>(hw.num_cores), 24);
  reader.integer("batch", m.config.batch);
  reader.integer("kv", m.config.kv);
  reader.integer("chunk", m.config.chunk);
  reader.integer("heads", m.config.heads);
  reader.integer("q_len", m.config.q_len);
  reader.integer("cores", m.config.cores);
  reader.integer("block_size", m.config.block_size);
  m.config.opts = reader.opts("opt");
  const auto instructions = [](const MlaConfig& config, const HwParams& params) {
    return estimate_mla_instructions(config, params);
  };
  reader.check(m.config, hw, "chunk", instructions, "batch");
  if (m.speedup) {
    m.base = m.config;
    reader.integer("base_chunk", m.base.chunk);
    m.base.opts = reader.opts("base_opt");
    reader.check(m.base, hw, "base_chunk", instructions, "batch");
  }
}

/// A flash-attention row's configuration (`ditops-sim fa`'s defaults for missing columns; seq
/// is required), and its speedup base.
void read_fa_row(const RowReader& reader, const HwParams& hw, Measurement& m) {
  m.flash = true;
  if (!reader.has("seq")) reader.fail("seq", "missing in the header (an fa row needs it)");
  FaConfig& config = m.fa;
  config.cores = std::min(static_cast<int>(hw.num_cores), 24);
  reader.integer("batch", config.batch);
  reader.integer("heads", config.heads);
  reader.integer("seq", config.seq);
  reader.integer("kv_seq", config.kv_seq);
  reader.integer("dim", config.dim);
  reader.integer("cores", config.cores);
  reader.integer("chunk", config.chunk);
  config.int8 = reader.word("dtype", {"bf16", "int8"}, "bf16") == "int8";
  config.opts = reader.opts("opt");
  const auto instructions = [](const FaConfig& sized, const HwParams& params) {
    return estimate_fa_instructions(sized, params);
  };
  reader.check(config, hw, "chunk", instructions, "seq");
  if (m.speedup) {
    m.fa_base = config;
    reader.integer("base_chunk", m.fa_base.chunk);
    m.fa_base.opts = reader.opts("base_opt");
    reader.check(m.fa_base, hw, "base_chunk", instructions, "seq");
  }
}

/// The rows a time row of one or more series gives: a speedup over each series' base (the
/// series' first row, which gives none and becomes the base here).
void add_series_rows(const RowReader& reader, const Measurement& m,
                     std::map<std::string, Measurement>& bases, std::vector<Measurement>& rows) {
  std::stringstream names(reader.cell("series"));
  std::string name;
  while (std::getline(names, name, '+')) {
    const auto [base, first] = bases.emplace(name, m);
    if (first) continue;
    const Measurement& from = base->second;
    if (from.flash != m.flash || from.includes_launch != m.includes_launch) {
      reader.fail("series", "'" + name + "' mixes kernels or launch-inclusive and kernel times");
    }
    Measurement ratio = m;
    ratio.speedup = true;
    ratio.base = from.config;
    ratio.fa_base = from.fa;
    ratio.series = name;
    ratio.value = from.value / m.value;
    rows.push_back(ratio);
  }
}

}  // namespace

std::vector<Measurement> parse_measurements(const std::string& text, const std::string& name,
                                            const HwParams& hw) {
  std::vector<Measurement> rows;
  std::map<std::string, Measurement> series_bases;
  std::stringstream stream(text);
  std::string line;
  int line_number = 0, data_rows = 0;
  std::map<std::string, std::size_t> columns;
  while (std::getline(stream, line)) {
    ++line_number;
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    std::vector<std::string> cells = split(line, ',');
    if (columns.empty()) {
      columns = header_columns(cells, RowReader(name, columns, {}, 0, line_number));
      continue;
    }
    Measurement m;
    m.row = ++data_rows;
    m.line = line_number;
    const RowReader reader(name, columns, std::move(cells), m.row, line_number);
    if (m.row > kMaxMeasurements) {
      reader.fail("-", "more than " + std::to_string(kMaxMeasurements) + " rows");
    }
    m.speedup = reader.has("speedup");
    if (reader.word("kernel", {"mla", "fa"}, "mla") == "fa") {
      read_fa_row(reader, hw, m);
    } else {
      read_mla_row(reader, hw, m);
    }
    m.value = reader.number(m.speedup ? "speedup" : "time_us");
    m.includes_launch = reader.word("includes_launch", {"0", "1"}, "0") == "1";
    if (reader.has("series")) {
      add_series_rows(reader, m, series_bases, rows);
    } else {
      rows.push_back(m);
    }
  }
  if (columns.empty()) throw SimError(name + ": no header row");
  if (rows.empty()) throw SimError(name + ": no measurement rows");
  return rows;
}

std::vector<Measurement> load_measurements(const std::string& path, const HwParams& hw) {
  return load_measurement_set(path, hw).rows;
}

MeasurementSet load_measurement_set(const std::string& path, const HwParams& hw) {
  const core::FileContents file =
      core::read_regular_file(path, core::kMaxInputFileBytes, /*follow_symlink=*/true);
  if (file.status != core::FileStatus::ok) {
    throw SimError("cannot read " + path + ": it " + file.problem);
  }
  MeasurementSet set;
  set.name = path.substr(path.find_last_of('/') + 1);
  set.name = set.name.substr(0, set.name.rfind('.'));
  std::stringstream stream(file.text);
  std::string line;
  const std::string role_tag = "# role:";
  while (std::getline(stream, line)) {
    if (line.rfind(role_tag, 0) != 0) continue;
    const std::vector<std::string> words = split(line.substr(role_tag.size()), ' ');
    for (const std::string& word : words) {
      if (!word.empty()) set.role = word;
    }
  }
  set.rows = parse_measurements(file.text, path, hw);
  return set;
}

std::string measurement_label(const Measurement& m) {
  if (m.flash) {
    std::string text = "fa seq " + std::to_string(m.fa.seq) + " kv-seq " +
                       std::to_string(m.fa.kv_seq > 0 ? m.fa.kv_seq : m.fa.seq) + " dim " +
                       std::to_string(m.fa.dim) + " cores " + std::to_string(m.fa.cores);
    if (m.fa.heads != 1) text += " heads " + std::to_string(m.fa.heads);
    if (!m.series.empty()) return text + " vs first of " + m.series;
    return m.speedup ? text + " chunk " + std::to_string(m.fa.chunk) + " vs chunk " +
                           std::to_string(m.fa_base.chunk)
                     : text;
  }
  std::string text = "batch " + std::to_string(m.config.batch) + " kv " +
                     std::to_string(m.config.kv) + " chunk " + std::to_string(m.config.chunk) +
                     " " + mla_opts_to_string(m.config.opts);
  if (!m.series.empty()) return text + " vs first of " + m.series;
  if (m.speedup) {
    text += " vs chunk " + std::to_string(m.base.chunk) + " " + mla_opts_to_string(m.base.opts);
  }
  return text;
}

double predict(const Measurement& measurement, const HwParams& hw) {
  return predict_rows({measurement}, hw, 1).front();
}

std::vector<std::string> default_fit_names() {
  std::vector<std::string> names;
  for (const HwParamInfo& info : hw_param_table()) {
    if (info.source[0] == 'U' && std::string(info.name) != "kernel_launch_us") {
      names.emplace_back(info.name);
    }
  }
  return names;
}

FitResult fit_parameters(const std::vector<Measurement>& rows, const HwParams& start,
                         const std::vector<std::string>& names, int threads) {
  FitResult result;
  result.names = names;
  std::vector<const HwParamInfo*> infos;
  std::vector<Bounds> bounds;
  for (const std::string& name : names) {
    infos.push_back(fittable_param(name, start, infos));
    result.start.push_back(start.*infos.back()->field);
    bounds.push_back(fit_bounds(*infos.back(), result.start.back()));
  }
  const std::size_t n = infos.size();
  const auto params_at = [&](const std::vector<double>& x) {
    HwParams hw = start;
    for (std::size_t i = 0; i < n; ++i) hw.*infos[i]->field = result.start[i] * std::exp(x[i]);
    return hw;
  };
  const auto evaluate = [&](const std::vector<double>& x) {
    ++result.evaluations;
    return residuals(rows, predict_rows(rows, params_at(x), threads));
  };
  const auto clamp = [&](std::vector<double> x) {
    for (std::size_t i = 0; i < n; ++i) x[i] = std::clamp(x[i], bounds[i].low, bounds[i].high);
    return x;
  };

  std::vector<double> x(n, 0.0);
  std::vector<double> r = evaluate(x);
  const std::vector<double> r_start = r;
  double cost = squared(r);
  double damping = 1e-2;
  Matrix jacobian(rows.size(), std::vector<double>(n, 0.0));
  // Forward differences, stepping inward at an upper bound. Between full Jacobians, Broyden's
  // rank-one update keeps the linearization current at one simulation of the set per step.
  const auto full_jacobian = [&] {
    for (std::size_t i = 0; i < n; ++i) {
      std::vector<double> probe = x;
      const double step =
          x[i] + kDifferenceStep <= bounds[i].high ? kDifferenceStep : -kDifferenceStep;
      probe[i] += step;
      const std::vector<double> rp = evaluate(probe);
      for (std::size_t j = 0; j < rows.size(); ++j) jacobian[j][i] = (rp[j] - r[j]) / step;
    }
  };
  if (n > 0) full_jacobian();
  bool fresh = true;  // the Jacobian was just computed by differences
  for (int iteration = 0; iteration < kMaxIterations && n > 0; ++iteration) {
    const Matrix normal = normal_matrix(jacobian, n);
    std::vector<double> gradient(n, 0.0);
    for (std::size_t j = 0; j < rows.size(); ++j) {
      for (std::size_t a = 0; a < n; ++a) gradient[a] += jacobian[j][a] * r[j];
    }
    bool improved = false, moved = false;
    for (int attempt = 0; attempt < kMaxDampingTries; ++attempt) {
      Matrix damped = normal;
      std::vector<double> rhs(n);
      for (std::size_t a = 0; a < n; ++a) {
        damped[a][a] += damping * normal[a][a] + 1e-9;
        rhs[a] = -gradient[a];
      }
      const std::vector<double> delta = solve_spd(damped, rhs);
      std::vector<double> candidate = x;
      for (std::size_t a = 0; a < n; ++a) {
        candidate[a] += std::clamp(delta[a], -kMaxStep, kMaxStep);
      }
      candidate = clamp(candidate);
      const std::vector<double> rc = evaluate(candidate);
      const double candidate_cost = squared(rc);
      if (candidate_cost < cost) {
        broyden_update(jacobian, x, candidate, r, rc);
        const double gain = (cost - candidate_cost) / std::max(cost, 1e-300);
        x = candidate;
        r = rc;
        cost = candidate_cost;
        damping = std::max(damping / 3, 1e-6);
        improved = gain > kMinImprovement;
        moved = true;
        break;
      }
      damping *= 4;
    }
    if (improved) {
      fresh = false;
      continue;
    }
    if (fresh) break;  // no progress even on a fresh linearization: a minimum
    full_jacobian();   // the updated Jacobian may have drifted: refresh it once
    fresh = true;
    if (!moved) damping = 1e-2;
  }

  result.fitted = params_at(x);
  validate(result.fitted);
  for (std::size_t i = 0; i < n; ++i) result.value.push_back(result.fitted.*infos[i]->field);
  const std::vector<double> held_out = held_out_residuals(jacobian, r, n);
  const std::vector<double> predicted = predict_rows(rows, result.fitted, threads);
  for (std::size_t j = 0; j < rows.size(); ++j) {
    FitRow row;
    row.measured = rows[j].value;
    row.before = rows[j].value * std::exp(r_start[j]);
    row.after = predicted[j];
    row.held_out = rows[j].value * std::exp(held_out[j]);
    result.rows.push_back(row);
  }
  result.error_before = rms(r_start);
  result.error_after = rms(r);
  result.error_held_out = rms(held_out);
  return result;
}

}  // namespace ditops::sim
