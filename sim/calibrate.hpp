#pragma once
// Calibration: fits hardware parameters to measured MLA decode or flash-attention times, speedups
// or ratios (an msprof run on the chip, or published timings; one configuration per CSV row).
// Residuals are ln(predicted / measured), so times and speedups weigh alike; the fit is
// Levenberg-Marquardt on the log of each parameter, bounded to [1/4, 4] x its starting value (and
// its range), with forward-difference Jacobians. Deterministic: the same file and start give the
// same fit. Leave-one-out predictions come from the fit's leverages (r_i / (1 - h_ii)), without
// refitting.

#include <string>
#include <vector>

#include "sim/fa.hpp"
#include "sim/hw.hpp"
#include "sim/mla.hpp"

namespace ditops::sim {

struct Measurement {
  int row = 0;   // data row, 1-based (the header is not counted)
  int line = 0;  // line in the file
  MlaConfig config;
  bool speedup = false;  // value = time(base) / time(config); else a time in us
  MlaConfig base;        // the speedup's base configuration
  // A flash-attention row (kernel "fa"): `fa` and `fa_base` replace `config` and `base`.
  bool flash = false;
  FaConfig fa, fa_base;
  // The measured time includes the kernel launch: the model adds kernel_launch_us to both
  // configurations' times.
  bool includes_launch = false;
  // A row of a series is a speedup over the series' first row (its base); the first row itself
  // gives no measurement. `series` names it; a data row in several series gives one each.
  std::string series;
  double value = 0;
};

/// Parses a measurement CSV (sim/README.md, "How to calibrate against msprof" and "How well it
/// predicts"); lines starting with '#' are comments. SimError
/// "NAME: row R (line L), column C: problem" on a missing column, a bad or out-of-range value,
/// an unknown switch or a non-positive time; at most kMaxMeasurements rows.
std::vector<Measurement> parse_measurements(const std::string& text, const std::string& name,
                                            const HwParams& hw);
inline constexpr int kMaxMeasurements = 10000;

/// Reads (a regular file of at most 64 MiB) and parses a measurement CSV.
std::vector<Measurement> load_measurements(const std::string& path, const HwParams& hw);

/// A measurement file with its role: the value of its "# role: NAME" comment line
/// ("calibration" or "held-out"; "" when there is none).
struct MeasurementSet {
  std::string name;  // the file name without its directory and extension
  std::string role;
  std::vector<Measurement> rows;
};
MeasurementSet load_measurement_set(const std::string& path, const HwParams& hw);

/// The model's values for every row, simulating each distinct configuration once.
std::vector<double> predict_rows(const std::vector<Measurement>& rows, const HwParams& hw,
                                 int threads = 2);

/// "batch 1 kv 512 chunk 4 all vs chunk 1 none" (MLA), "fa seq 2048 kv-seq 8192 dim 128 cores 16"
/// (flash attention; "vs first of SERIES" for a series row).
std::string measurement_label(const Measurement& measurement);

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
