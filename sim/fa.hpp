#pragma once
// Program builder for prefill flash attention (FLUX / Wan DiT self-attention), dense or
// block-sparse, on the same chip model and kit as the MLA decode program (sim/README.md).
//
// Tasks are (batch, head, 128-row query tile). Per task the AIC runs QK (S = q Kᵀ, to a GM
// workspace) and PV (O_tmp = P V) over the task's KV tiles in the ops/schedule cube order for
// the chunk, and the two AIVs (64 rows each) run SM (online softmax, P to GM) and UP (rescale
// the running O, kept in UB for the whole task, and add O_tmp) in the vector order, handing S, P
// and O_tmp through GM with the cross-core flags QK_READY, SOFTMAX_READY and UPDATE_READY. A
// KV tile is up to kv_tile_tokens of kept keys (the kept 128-token blocks of the query tile,
// gathered). Block-sparse masks come from a uniform density or from the RainFusion layout
// geometry of ops/sparse/layout (the CPU library's token orders, windows and sink).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sim/hw.hpp"
#include "sim/mla.hpp"
#include "sim/program.hpp"

namespace ditops::sim {

enum class FaPattern : std::uint8_t { dense, spatial, temporal, textural };

struct FaConfig {
  int batch = 1;
  int heads = 24;
  int seq = 4608;     // query tokens
  int kv_seq = 0;     // key tokens; 0 = seq
  int dim = 128;      // head dimension (q, k and v)
  bool int8 = false;  // int8 q/k/v and P (else bf16)
  int cores = 24;
  int chunk = 2;
  // Block sparsity: a uniform kept share of each query tile's KV blocks (1 = dense) ...
  double density = 1.0;
  // ... or a RainFusion layout (self-attention: seq = text + frames x height x width).
  bool rainfusion = false;
  int frames = 1, height = 1, width = 1, text = 0;
  double sparsity = 0.64;
  std::vector<FaPattern> patterns;  // head h uses patterns[h % size]; empty = spatial,
                                    // temporal, textural
  MlaOptimizations opts;            // nope_rope_split does not apply (no rope part)
  SimMode mode = SimMode::fine;     // every instruction, or one folded event per stage
  int block = 128;                  // sparse block and query tile rows
};

/// Throws SimError naming the field and the allowed range.
void validate(const FaConfig& config, const HwParams& hw);

struct FaTask {
  int batch = 0, head = 0, q_tile = 0, rows = 0;
  int mask = 0;  // index into FaPlan::kept
  int core = 0;
};

struct FaPlan {
  int q_tiles = 0, kv_blocks = 0;
  int kv_tile_tokens = 0;  // keys per QK/PV stage
  int cores_used = 0;
  double kept_share = 1;  // kept (query tile, KV block) pairs over all, mean over heads
  std::vector<std::string> mask_names;              // per mask: "dense", "spatial", ...
  std::vector<std::vector<std::vector<int>>> kept;  // [mask][q_tile] -> kept KV blocks
  // K/V reuse through L2: per mask and KV block, the query tile that reads it from HBM (the
  // others hit L2); empty lists when the heads in flight do not fit l2_bytes.
  bool kv_reuse = false;
  std::vector<std::vector<int>> first_reader;
  std::vector<FaTask> tasks;  // in execution order per core
};

/// Block masks, tasks and their longest-first assignment to cores.
FaPlan plan_fa(const FaConfig& config, const HwParams& hw);

Program build_fa_program(const FaConfig& config, const HwParams& hw, FaPlan* plan = nullptr);

/// Where a RainFusion run's time goes, beside the ideal speedup over dense 1 / (1 - sparsity):
/// the tiles' costs (each tile's busier unit, folded as in coarse mode, without contention)
/// split into the keys at the ideal share, the keys kept beyond it, the text and first-frame
/// keys, first reads from HBM, partial tiles and index handling (copy runs of gathered blocks);
/// the rest of the simulated time (flag hand-offs, fill and drain, contention, imbalance) is
/// charged per KV tile. The parts are non-negative and add up to `time_us`.
struct FaBreakdown {
  double ideal_speedup = 1;
  std::vector<std::pair<std::string, double>> parts;  // name -> us
};
FaBreakdown rainfusion_breakdown(const FaConfig& config, const HwParams& hw, const FaPlan& plan,
                                 double time_us);

/// Instructions build_fa_program emits, counted from the plan without building it.
std::uint64_t estimate_fa_instructions(const FaConfig& config, const HwParams& hw);

/// "batch 1, heads 24, seq 4608, kv-seq 4608, dim 128, bf16, cores 24, chunk 2, dense, opts none"
std::string describe(const FaConfig& config);

/// Parses "spatial,temporal,textural,dense" names (SimError on an unknown one).
std::vector<FaPattern> parse_fa_patterns(const std::string& list);
const char* fa_pattern_name(FaPattern pattern) noexcept;

}  // namespace ditops::sim
