// ditops-sim calibrate: hardware parameters fitted to measured MLA or flash-attention times,
// speedups or ratios.

#include "sim/calibrate.hpp"

#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "sim/error.hpp"
#include "sim/hw.hpp"
#include "sim/mla.hpp"
#include "tools/ditops_sim/cli.hpp"
#include "tools/ditops_sim/commands.hpp"
#include "tools/ditops_sim/run.hpp"

namespace ditops::tools::sim_cli {
namespace {

std::string fixed(double value, int digits) {
  char text[32];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

}  // namespace

int command_calibrate(const Options& options) {
  const sim::HwParams start = load_hw(options);
  const auto path = options.get("--measured");
  if (!path) throw UsageError("calibrate needs --measured FILE.csv");
  std::vector<sim::Measurement> rows;
  try {
    rows = sim::load_measurements(*path, start);
  } catch (const sim::SimError& error) {
    throw UsageError(std::string("--measured ") + error.what());
  }
  std::vector<std::string> names = sim::default_fit_names();
  if (const auto list = options.get("--fit")) {
    names.clear();
    std::stringstream stream(*list);
    std::string name;
    while (std::getline(stream, name, ',')) names.push_back(name);
  }
  sim::FitResult fit;
  try {
    fit = sim::fit_parameters(rows, start, names);
  } catch (const sim::SimError& error) {
    throw UsageError(std::string("--fit: ") + error.what());
  }
  if (const auto out = options.get("--out")) {
    write_file("--out", *out, [&](std::ostream& stream) { stream << sim::hw_to_json(fit.fitted); });
  }
  if (options.json) {
    nlohmann::ordered_json json;
    nlohmann::ordered_json params = nlohmann::ordered_json::object();
    for (std::size_t i = 0; i < fit.names.size(); ++i) {
      params[fit.names[i]] = {{"start", fit.start[i]}, {"fitted", fit.value[i]}};
    }
    json["params"] = params;
    nlohmann::ordered_json array = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const sim::Measurement& m = rows[i];
      const sim::FitRow& row = fit.rows[i];
      array.push_back({{"row", m.row},
                       {"config", sim::measurement_label(m)},
                       {"kind", m.speedup ? "speedup" : "time_us"},
                       {"measured", row.measured},
                       {"predicted_before", row.before},
                       {"predicted_after", row.after},
                       {"predicted_held_out", row.held_out},
                       {"error_before", std::log(row.before / row.measured)},
                       {"error_after", std::log(row.after / row.measured)}});
    }
    json["rows"] = array;
    json["error_before"] = fit.error_before;
    json["error_after"] = fit.error_after;
    json["error_held_out"] = fit.error_held_out;
    json["evaluations"] = fit.evaluations;
    std::cout << json.dump(2) << '\n';
    return 0;
  }
  std::cout << "ditops-sim calibrate: " << rows.size() << " rows from " << *path << ", "
            << fit.evaluations << " simulations of the set\n"
            << "errors are ln(predicted / measured); held-out = the leave-one-out prediction "
               "(the fit without that row, to first order)\n\n";
  std::printf("%4s  %-48s %10s %10s %10s %10s %8s %8s\n", "row", "configuration", "measured",
              "before", "after", "held-out", "err bef", "err aft");
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const sim::FitRow& row = fit.rows[i];
    std::printf(
        "%4d  %-48s %10.3f %10.3f %10.3f %10.3f %7.1f%% %7.1f%%\n", rows[i].row,
        (sim::measurement_label(rows[i]) + (rows[i].speedup ? " (speedup)" : " (us)")).c_str(),
        row.measured, row.before, row.after, row.held_out,
        100 * std::log(row.before / row.measured), 100 * std::log(row.after / row.measured));
  }
  std::printf("\n%-34s %12s %12s %8s\n", "parameter", "start", "fitted", "ratio");
  for (std::size_t i = 0; i < fit.names.size(); ++i) {
    std::printf("%-34s %12s %12s %8s\n", fit.names[i].c_str(),
                sim::number_text(fit.start[i]).c_str(), sim::number_text(fit.value[i]).c_str(),
                fixed(fit.value[i] / fit.start[i], 3).c_str());
  }
  std::printf("\nRMS error: before %.1f %%, after %.1f %%, held-out (leave-one-out) %.1f %%\n",
              100 * fit.error_before, 100 * fit.error_after, 100 * fit.error_held_out);
  return 0;
}

}  // namespace ditops::tools::sim_cli
