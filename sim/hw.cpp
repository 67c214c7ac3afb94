#include "sim/hw.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <set>

#include "ops/core/file.hpp"
#include "sim/error.hpp"

namespace ditops::sim {
namespace {

constexpr const char* kFormat = "ditops-sim-hw/1";

/// Whole numbers as JSON integers (4096, not 4096.0).
nlohmann::ordered_json json_number(double value) {
  if (value == std::floor(value) && std::fabs(value) < 9e15) return static_cast<long long>(value);
  return value;
}

}  // namespace

const std::vector<HwParamInfo>& hw_param_table() {
  // Sources (docs/npu-model.md, which documents each row): Huawei Ascend C / CANN docs, CANN
  // platform .ini, the GEMM tiling cycle model cache_tiling_cycle_model.cc, the ATB kernel
  // mla_int8.cce, arXiv:2509.25224.
  static const std::vector<HwParamInfo> table = {
      {"num_cores", "cores", "H: 910B2 class has 24 AI cores (910B1: 25, 910B3/B4: 20)",
       &HwParams::num_cores, 1, 4096, true},
      {"clock_ghz", "GHz", "M: 1.8 GHz (910B4: 1.5)", &HwParams::clock_ghz, 0.1, 10},
      {"cube_int8_macs_per_cycle", "MAC/cycle", "H: cube int8 16x32x16 per cycle",
       &HwParams::cube_int8_macs_per_cycle, 16, 1 << 20},
      {"cube_fp16_macs_per_cycle", "MAC/cycle", "H: cube fp16/bf16 16x16x16 per cycle",
       &HwParams::cube_fp16_macs_per_cycle, 16, 1 << 20},
      {"vector_bytes_per_cycle", "B/cycle", "H: 256 B per cycle per AIV",
       &HwParams::vector_bytes_per_cycle, 1, 1 << 16},
      {"vector_issue_cycles", "cycles",
       "U: fixed start-up per vector instruction, calibration guess",
       &HwParams::vector_issue_cycles, 0, 1e4},
      {"l1_bytes", "B", "H: L1 512 KiB per AIC", &HwParams::l1_bytes, 1 << 10, 1 << 30},
      {"l0a_bytes", "B", "H: L0A 64 KiB per AIC", &HwParams::l0a_bytes, 1 << 10, 1 << 30},
      {"l0b_bytes", "B", "H: L0B 64 KiB per AIC", &HwParams::l0b_bytes, 1 << 10, 1 << 30},
      {"l0c_bytes", "B", "H: L0C 128 KiB per AIC", &HwParams::l0c_bytes, 1 << 10, 1 << 30},
      {"ub_bytes", "B", "H: UB 192 KiB per AIV", &HwParams::ub_bytes, 1 << 10, 1 << 30},
      {"l2_bytes", "B",
       "M: 192 MiB L2 shared by all cores (910B product documentation); only its capacity is "
       "used, to decide whether re-read data is still there",
       &HwParams::l2_bytes, 1 << 20, 1LL << 36},
      {"l2_read_latency_cycles", "cycles", "H: L2 read hit 241 cycles (Huawei CA-model config)",
       &HwParams::l2_read_latency_cycles, 0, 1e5},
      {"l2_write_latency_cycles", "cycles", "H: L2 write 96 cycles (Huawei CA-model config)",
       &HwParams::l2_write_latency_cycles, 0, 1e5},
      {"l2_bandwidth_bytes_per_cycle", "B/cycle",
       "U: aggregate L2 bandwidth shared by all cores, not published; calibration guess",
       &HwParams::l2_bandwidth_bytes_per_cycle, 1, 1 << 20},
      {"hbm_bandwidth_bytes_per_cycle", "B/cycle",
       "U: ini ddr_rate 32 B/cycle/core x 24 = 768 B/cycle = 1.38 TB/s at 1.8 GHz; "
       "effective 1.2-1.6 TB/s",
       &HwParams::hbm_bandwidth_bytes_per_cycle, 1, 1 << 20},
      {"hbm_latency_cycles", "cycles", "U: not published, 500-1000 cycles assumed",
       &HwParams::hbm_latency_cycles, 0, 1e5},
      {"mte2_gm_bytes_per_cycle", "B/cycle", "H: per-core GM read by MTE2 (cycle model)",
       &HwParams::mte2_gm_bytes_per_cycle, 1, 1 << 16},
      {"mte2_small_copy_bytes", "B", "H: copies under 16 KiB pay the head (cycle model)",
       &HwParams::mte2_small_copy_bytes, 0, 1 << 30},
      {"mte2_small_copy_head_cycles", "cycles", "H: 100-cycle head of small copies (cycle model)",
       &HwParams::mte2_small_copy_head_cycles, 0, 1e5},
      {"nd2nz_cycles", "cycles", "H: ND->NZ conversion on a GM->L1 copy (cycle model)",
       &HwParams::nd2nz_cycles, 0, 1e5},
      {"l2_read_bytes_per_cycle", "B/cycle", "M: per-core L2 read rate (hits)",
       &HwParams::l2_read_bytes_per_cycle, 1, 1 << 16},
      {"mte3_ub_to_l2_bytes_per_cycle", "B/cycle", "M: UB->L2 64 B/cycle",
       &HwParams::mte3_ub_to_l2_bytes_per_cycle, 1, 1 << 16},
      {"mte1_l0a_bytes_per_cycle", "B/cycle", "M: MTE1 L1->L0A 256 B/cycle",
       &HwParams::mte1_l0a_bytes_per_cycle, 1, 1 << 16},
      {"mte1_l0b_bytes_per_cycle", "B/cycle", "M: MTE1 L1->L0B 128 B/cycle",
       &HwParams::mte1_l0b_bytes_per_cycle, 1, 1 << 16},
      {"mte1_start_cycles", "cycles", "M: 26-cycle start per MTE1 load",
       &HwParams::mte1_start_cycles, 0, 1e5},
      {"fix_l0c_read_bytes_per_cycle", "B/cycle", "M: FIXPIPE reads L0C at 256 B/cycle",
       &HwParams::fix_l0c_read_bytes_per_cycle, 1, 1 << 16},
      {"fix_gm_write_bytes_per_cycle", "B/cycle", "M: FIXPIPE writes out at 128 B/cycle",
       &HwParams::fix_gm_write_bytes_per_cycle, 1, 1 << 16},
      {"cross_core_flag_latency_cycles", "cycles",
       "U: CrossCoreSetFlag -> visible at the waiter; unknown, sweep 100-1000",
       &HwParams::cross_core_flag_latency_cycles, 0, 1e6},
      {"intra_core_event_latency_cycles", "cycles",
       "U: SET_FLAG -> WAIT_FLAG between pipes of one core; not published, assumed small",
       &HwParams::intra_core_event_latency_cycles, 0, 1e5},
      {"cross_core_flag_ids", "ids", "H: CrossCoreSetFlag flag ids 0-10",
       &HwParams::cross_core_flag_ids, 1, 64, true},
      {"cross_core_max_pending", "sets", "H: at most 16 pending sets per flag id",
       &HwParams::cross_core_max_pending, 1, 1 << 16, true},
      {"intra_core_event_ids", "ids", "H: 8 event ids per pipe pair",
       &HwParams::intra_core_event_ids, 1, 64, true},
      {"kernel_launch_us", "us", "U: kernel launch, third-party measurements 5-15 us",
       &HwParams::kernel_launch_us, 0, 1e6},
  };
  return table;
}

void validate(const HwParams& params) {
  for (const HwParamInfo& info : hw_param_table()) {
    const double value = params.*info.field;
    if (!(value >= info.min && value <= info.max) || (info.integer && value != std::floor(value))) {
      throw SimError(std::string("hardware parameter ") + info.name + " must be " +
                     (info.integer ? "an integer" : "a number") + " in [" + number_text(info.min) +
                     ", " + number_text(info.max) + "] " + info.unit + " (got " +
                     number_text(value) + ")");
    }
  }
}

const HwParamInfo* find_hw_param(const std::string& name) {
  for (const HwParamInfo& info : hw_param_table()) {
    if (name == info.name) return &info;
  }
  return nullptr;
}

void apply_overrides(HwParams& params, const std::string& text) {
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string item = text.substr(start, comma - start);
    const std::size_t equals = item.find('=');
    if (equals == std::string::npos) throw SimError("expects NAME=VALUE (got '" + item + "')");
    const std::string name = item.substr(0, equals);
    const std::string value = item.substr(equals + 1);
    const HwParamInfo* info = find_hw_param(name);
    if (info == nullptr) throw SimError("unknown hardware parameter '" + name + "'");
    char* end = nullptr;
    const double number = std::strtod(value.c_str(), &end);
    if (value.empty() || end != value.c_str() + value.size()) {
      throw SimError(name + " expects a number (got '" + value + "')");
    }
    params.*(info->field) = number;
    start = comma + 1;
  }
  validate(params);
}

std::string hw_to_json(const HwParams& params) {
  nlohmann::ordered_json params_json = nlohmann::ordered_json::object();
  for (const HwParamInfo& info : hw_param_table()) {
    nlohmann::ordered_json entry;
    entry["value"] = json_number(params.*info.field);
    entry["unit"] = info.unit;
    entry["source"] = info.source;
    entry["range"] = {json_number(info.min), json_number(info.max)};
    params_json[info.name] = entry;
  }
  nlohmann::ordered_json root;
  root["format"] = kFormat;
  root["params"] = params_json;
  return root.dump(2) + "\n";
}

HwParams hw_from_json(const std::string& text) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    // Not only parse_error: a number beyond double's range (1e400) is an out_of_range.
    throw SimError(std::string("hardware JSON is malformed: ") + error.what());
  }
  if (!root.is_object()) throw SimError("hardware JSON must be an object");
  for (const auto& [key, value] : root.items()) {
    if (key != "format" && key != "params") {
      throw SimError("hardware JSON has unknown top-level key \"" + key + "\"");
    }
  }
  if (!root.contains("format") || !root["format"].is_string() ||
      root["format"].get<std::string>() != kFormat) {
    throw SimError(std::string("hardware JSON needs \"format\": \"") + kFormat + "\"");
  }
  if (!root.contains("params") || !root["params"].is_object()) {
    throw SimError("hardware JSON needs a \"params\" object");
  }
  const nlohmann::json& params_json = root["params"];
  std::set<std::string> known;
  HwParams params;
  for (const HwParamInfo& info : hw_param_table()) {
    known.insert(info.name);
    const std::string name = info.name;
    if (!params_json.contains(name)) {
      throw SimError("hardware JSON is missing parameter \"" + name + "\"");
    }
    const nlohmann::json& entry = params_json[name];
    if (!entry.is_object()) {
      throw SimError("hardware parameter \"" + name +
                     "\" must be an object with value, unit and source (range is optional)");
    }
    for (const auto& [key, value] : entry.items()) {
      if (key != "value" && key != "unit" && key != "source" && key != "range") {
        throw SimError("hardware parameter \"" + name + "\" has unknown key \"" + key + "\"");
      }
    }
    if (!entry.contains("value") || !entry["value"].is_number()) {
      throw SimError("hardware parameter \"" + name + "\" needs a numeric \"value\"");
    }
    if (!entry.contains("unit") || !entry["unit"].is_string()) {
      throw SimError("hardware parameter \"" + name + "\" needs a string \"unit\"");
    }
    if (!entry.contains("source") || !entry["source"].is_string()) {
      throw SimError("hardware parameter \"" + name + "\" needs a string \"source\"");
    }
    const std::string unit = entry["unit"].get<std::string>();
    if (unit != info.unit) {
      throw SimError("hardware parameter \"" + name + "\" has unit \"" + unit + "\", expected \"" +
                     info.unit + "\"");
    }
    params.*info.field = entry["value"].get<double>();
  }
  for (const auto& [key, value] : params_json.items()) {
    if (known.count(key) == 0)
      throw SimError("hardware JSON has unknown parameter \"" + key + "\"");
  }
  validate(params);
  return params;
}

HwParams load_hw_file(const std::string& path) {
  // A directory is no JSON file, and /dev/zero never ends: only regular files are read.
  const core::FileContents file =
      core::read_regular_file(path, core::kMaxInputFileBytes, /*follow_symlink=*/true);
  if (file.status != core::FileStatus::ok) {
    throw SimError("cannot read hardware file " + path + ": it " + file.problem);
  }
  try {
    return hw_from_json(file.text);
  } catch (const SimError& error) {
    throw SimError(path + ": " + error.what());
  }
}

}  // namespace ditops::sim
