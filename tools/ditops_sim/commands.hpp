#pragma once
// ditops-sim's commands, one source file each; main.cpp dispatches to them.

#include "sim/hw.hpp"
#include "sim/mla.hpp"
#include "tools/ditops_sim/cli.hpp"
#include "tools/ditops_sim/run.hpp"

namespace ditops::tools::sim_cli {

int command_mla(const Options& options);        // mla.cpp
int command_sweep(const Options& options);      // sweep.cpp
int command_fa(const Options& options);         // fa.cpp
int command_calibrate(const Options& options);  // calibrate.cpp
int command_hw(const Options& options);         // hw.cpp
int command_validate(const Options& options);   // validate.cpp

// mla.cpp's configuration steps, which sweep takes for every point of its grid.

/// The shared mla/sweep options; a sweep's list flags are set by the caller.
sim::MlaConfig mla_config(const Options& options, const sim::HwParams& hw);

/// The configuration's values, and the model it runs in (from the size of its program,
/// estimated before it is built).
ModeChoice validate_config(sim::MlaConfig& config, const sim::HwParams& hw, const Options& options);

}  // namespace ditops::tools::sim_cli
