#pragma once
// Program builder for the int8 MLA paged-attention decode kernel (sim/README.md).
//
// The kernel: per task (sequence, head group, KV split) the AIC runs QK and PV and the two AIVs
// run SM and UP (each AIV owns half of the task's rows), in the stage order of
// ops/schedule for the chosen chunk, handing S, P and O_tmp through ping-pong GM workspaces
// with cross-core flags QK_READY, SOFTMAX_READY and UPDATE_READY (mode 2). Small batches split
// the KV range across cores and end with a combine pass behind a mode-0 barrier.

#include <cstdint>
#include <string>
#include <vector>

#include "sim/hw.hpp"
#include "sim/program.hpp"

namespace ditops::sim {

/// The optimizations of sim/README.md, each a named switch (`--opt NAME`).
struct MlaOptimizations {
  bool nope_rope_split = false;  // two QK flags: S_nope ready, then S_rope ready
  bool up_pingpong = false;      // double-buffered UB tiles in UP
  bool sm_head_group = false;    // SM processes 32 rows per step instead of 16
  bool tail_reduce = false;      // row max / row sum only over the valid part of a partial block
  bool unit_flag = false;        // FIX drains L0C in pieces while M still runs
  bool sync_reduce = false;      // one flag per chunk group instead of one per block
  bool int8_layout = false;      // P written in the cube's NZ layout: no ND->NZ on load
  bool cube_reorder = false;     // chunk >= 2: next group's QK interleaved with this group's PV
};

struct MlaOptInfo {
  const char* name;
  const char* description;
  bool MlaOptimizations::*field;
};
const std::vector<MlaOptInfo>& mla_opt_table();

/// Parses "name,name,..." ("all" turns on every switch, "none" or "" none). SimError on an
/// unknown name.
MlaOptimizations parse_mla_opts(const std::string& list);
std::string mla_opts_to_string(const MlaOptimizations& opts);  // "none" or "a,b"

struct MlaConfig {
  int batch = 1;
  int kv = 2048;         // tokens per sequence
  int heads = 128;       // query heads (one latent KV head)
  int q_len = 1;         // query tokens per sequence (MTP)
  int cores = 24;        // AI cores the kernel launches on
  int block_size = 128;  // paged KV block size (64 or 128)
  int chunk = 2;         // 1, 2 or 4
  MlaOptimizations opts;
  SimMode mode = SimMode::fine;  // every instruction, or one folded event per stage
  // Flash-decoding split policy: a split gets at least this many KV blocks, so its QK/PV
  // pipeline has a full chunk-4 group to overlap (fewer blocks would be all fill and drain).
  int min_blocks_per_split = 4;
  // Rows (heads x q_len) per task: one L0C tile of S (rows x 128 tokens x int32) must fit half
  // of L0C, and the AIVs' UB tiles are sized for 64 rows each.
  int max_rows_per_task = 128;
};

/// Throws SimError naming the field and the allowed range.
void validate(const MlaConfig& config, const HwParams& hw);

struct MlaTask {
  int sequence = 0;
  int head_group = 0;
  int split = 0;
  int first_block = 0;  // within the sequence
  int num_blocks = 0;
  int tokens = 0;  // valid tokens in this task
  int rows = 0;    // heads x q_len of this task
  int core = 0;
};

struct MlaPlan {
  int head_groups = 0;
  int heads_per_group = 0;
  int splits = 1;
  int blocks_per_sequence = 0;
  int cores_used = 0;
  bool combine = false;
  std::vector<MlaTask> tasks;  // in execution order per core
};

/// Task split and cost-balanced assignment (longest task first onto the least loaded core).
MlaPlan plan_mla(const MlaConfig& config, const HwParams& hw);

/// Builds the instruction program. Cross-core flag names are set for reports.
Program build_mla_program(const MlaConfig& config, const HwParams& hw, MlaPlan* plan = nullptr);

/// About how many instructions build_mla_program(config) emits (within ~10 %), from two small
/// builds: a caller can refuse a program too large to hold before building it.
std::uint64_t estimate_mla_instructions(const MlaConfig& config, const HwParams& hw);

/// "batch 1, kv 2048, heads 128, q-len 1, block 128, cores 24, chunk 2, opts none"
std::string describe(const MlaConfig& config);

// Cross-core flag ids used by the kernel.
inline constexpr int kFlagQkReady = 0;      // S (or S_nope with nope_rope_split) in GM
inline constexpr int kFlagQkRopeReady = 1;  // S_rope in GM (nope_rope_split only)
inline constexpr int kFlagSoftmaxReady = 2;
inline constexpr int kFlagUpdateReady = 3;
inline constexpr int kFlagCombine = 4;  // mode-0 barrier before the combine pass

}  // namespace ditops::sim
