#pragma once
// Calibration: fits hardware parameters to measured MLA decode times or speedups (an msprof run
// on the chip, one configuration per CSV row). Residuals are ln(predicted / measured), so times
// and speedups weigh alike; the fit is Levenberg-Marquardt on the log of each parameter,
// bounded to [1/4, 4] x its starting value (and its range), with forward-difference Jacobians.
// Deterministic: the same file and start give the same fit. Leave-one-out predictions come
// from the fit's leverages (r_i / (1 - h_ii)), without refitting.

#include <string>
#include <vector>

#include "sim/hw.hpp"
#include "sim/mla.hpp"

namespace ditops::sim {

struct Measurement {
  int row = 0;   // data row, 1-based (the header is not counted)
  int line = 0;  // line in the file
  MlaConfig config;
  bool speedup = false;  // value = time(base) / time(config); else a time in us
  MlaConfig base;        // the speedup's base configuration
  double value = 0;
};

/// Parses a measurement CSV (sim/README.md, "How to calibrate against msprof"). SimError
/// "NAME: row R (line L), column C: problem" on a missing column, a bad or out-of-range value,
/// an unknown switch or a non-positive time; at most kMaxMeasurements rows.
std::vector<Measurement> parse_measurements(const std::string& text, const std::string& name,
                                            const HwParams& hw);
inline constexpr int kMaxMeasurements = 10000;

/// Reads (a regular file of at most 64 MiB) and parses a measurement CSV.
std::vector<Measurement> load_measurements(const std::string& path, const HwParams& hw);

/// The model's value for one measurement (a time in us or a speedup) under `hw`.
double predict(const Measurement& measurement, const HwParams& hw);

struct FitRow {
  double measured = 0, before = 0, after = 0;
  double held_out = 0;  // leave-one-out prediction
};

struct FitResult {
  HwParams fitted;
  std::vector<std::string> names;  // the fitted parameters
  std::vector<double> start, value;
  std::vector<FitRow> rows;
  // RMS of ln(predicted / measured) over the rows
  double error_before = 0, error_after = 0, error_held_out = 0;
  int evaluations = 0;  // simulations of the whole set
};

/// Parameters tagged U in hw_param_table() that change a simulated time (kernel_launch_us is
/// reported beside time_us, never in it).
std::vector<std::string> default_fit_names();

/// Fits `names` (SimError for an unknown name or a starting value of 0) to `rows`, starting at
/// `start`. `threads` simulations run at once.
FitResult fit_parameters(const std::vector<Measurement>& rows, const HwParams& start,
                         const std::vector<std::string>& names, int threads = 2);

}  // namespace ditops::sim
