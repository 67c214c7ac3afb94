#pragma once
// Hardware parameters of the modeled Ascend 910B-class chip. Every number is a named parameter
// with a unit, a source tag (H = vendor document or code, M = derived or corroborated,
// U = unknown, a calibration guess) and a physically sensible range: a value outside it is a
// mistake, and would make the simulation useless (a bandwidth of 1e-4 B/cycle turns a decode
// step into years of simulated time). The JSON form is the `--hw` file format; `ditops-sim hw`
// prints the defaults with their ranges.

#include <string>
#include <vector>

namespace ditops::sim {

struct HwParams {
  // Chip
  double num_cores = 24;
  double clock_ghz = 1.8;
  // Compute
  double cube_int8_macs_per_cycle = 8192;  // 16x32x16
  double cube_fp16_macs_per_cycle = 4096;  // 16x16x16
  double vector_bytes_per_cycle = 256;
  double vector_issue_cycles = 16;
  // Buffers (bytes)
  double l1_bytes = 512 * 1024;
  double l0a_bytes = 64 * 1024;
  double l0b_bytes = 64 * 1024;
  double l0c_bytes = 128 * 1024;
  double ub_bytes = 192 * 1024;
  // Memory system
  double l2_bytes = 192.0 * 1024 * 1024;
  double l2_read_latency_cycles = 241;
  double l2_write_latency_cycles = 96;
  double l2_bandwidth_bytes_per_cycle = 4096;
  double hbm_bandwidth_bytes_per_cycle = 768;
  double hbm_latency_cycles = 600;
  // Per-unit data movers
  double mte2_gm_bytes_per_cycle = 64;
  double mte2_small_copy_bytes = 16 * 1024;
  double mte2_small_copy_head_cycles = 100;
  double nd2nz_cycles = 210;
  double l2_read_bytes_per_cycle = 110;
  double mte3_ub_to_l2_bytes_per_cycle = 64;
  double mte1_l0a_bytes_per_cycle = 256;
  double mte1_l0b_bytes_per_cycle = 128;
  double mte1_start_cycles = 26;
  double fix_l0c_read_bytes_per_cycle = 256;
  double fix_gm_write_bytes_per_cycle = 128;
  // Synchronization
  double cross_core_flag_latency_cycles = 300;
  double intra_core_event_latency_cycles = 8;
  double cross_core_flag_ids = 11;
  double cross_core_max_pending = 16;
  double intra_core_event_ids = 8;
  double kernel_launch_us = 10;
};

/// Name, unit, source tag and a one-line note for one parameter, and the range it must be in.
struct HwParamInfo {
  const char* name;
  const char* unit;
  const char* source;  // "H", "M" or "U" followed by where the number comes from
  double HwParams::*field;
  double min;
  double max;
  bool integer = false;  // a count (cores, ids)
};

/// Every parameter in a fixed order (the order of the JSON file).
const std::vector<HwParamInfo>& hw_param_table();

/// The JSON text of `params` (a valid --hw file).
std::string hw_to_json(const HwParams& params);

/// Parses a --hw file's text. Throws SimError on malformed JSON, unknown or missing keys, wrong
/// types, a unit that differs from the expected one, or a value out of range. A parameter's
/// "range" (what `hw` prints) is informational and not read.
HwParams hw_from_json(const std::string& text);

/// Reads and parses a --hw file (SimError naming the file on failure).
HwParams load_hw_file(const std::string& path);

/// Applies "NAME=VALUE[,NAME=VALUE...]" (the CLI's --set) to `params`, then validates them.
/// SimError naming the item on a missing '=', an unknown name, a value that is not a number, or
/// a value out of range.
void apply_overrides(HwParams& params, const std::string& text);

/// The parameter called `name`, or nullptr.
const HwParamInfo* find_hw_param(const std::string& name);

/// Range checks shared by the JSON loader, --set and programmatic callers (SimError naming the
/// parameter, its range and the value).
void validate(const HwParams& params);

/// Cycles per microsecond.
inline double cycles_per_us(const HwParams& params) { return params.clock_ghz * 1000.0; }

}  // namespace ditops::sim
