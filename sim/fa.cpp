#include "sim/fa.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <ditops/sparse.hpp>
#include <map>
#include <sstream>

#include "ops/schedule/schedule.hpp"
#include "ops/sparse/layout.hpp"
#include "sim/builder.hpp"
#include "sim/error.hpp"

namespace ditops::sim {
namespace {

namespace sched = ditops::schedule;

constexpr int kOutBytes = 2;  // bf16 output O

// Vector work per element of the fp32 S tile, in passes (tile bytes / 256 B per cycle) and
// instructions. These describe the kernel, not the chip.
constexpr double kSmElementwisePasses = 5;  // scale, subtract row max, exp (twice), cast P
constexpr double kSmReductionPasses = 4;    // row max and row sum, two passes each
constexpr double kSmInt8Passes = 4;         // int8: dequantize S (2), quantize P (2)
constexpr int kSmInstrs = 12;
constexpr double kUpPasses = 3;  // cast O_tmp, rescale the running O, add
constexpr int kUpInstrs = 3;
constexpr double kUpFinalPasses = 2;  // divide by the row sum, cast to bf16

// Rows per SM step (each AIV owns half of a 128-row query tile): a 32 x 256 fp32 S tile is
// 32 KiB, so two S tiles, two P tiles, two O_tmp tiles and the resident O fit the 192 KiB UB.
// (A 64-row step would not: sm_head_group has no further effect here.)
constexpr int kSmRows = 32;
constexpr int kUnitFlagPieces = 4;
constexpr long long kMaxMaskPairs = 1LL << 24;

// Cross-core flag ids: QK_READY, SOFTMAX_READY and UPDATE_READY as in the MLA program (mla.hpp).

/// One QK/PV stage: up to kv_tile_tokens kept keys. Keys whose K and V this head has not read
/// before come from HBM, the others are L2 hits; each part is loaded as one copy per contiguous
/// run of its blocks.
struct KvTile {
  int tokens = 0;
  int hbm_tokens = 0, hbm_runs = 0;
  int l2_tokens = 0, l2_runs = 0;
};

int kv_tokens(const FaConfig& config) { return config.kv_seq > 0 ? config.kv_seq : config.seq; }

/// The KV tiles of query tile `q_tile`: its kept blocks, in order, gathered into tiles. A block
/// is read from HBM by the first query tile of the head that keeps it (`first_reader`), from L2
/// by the later ones; with no reuse (an empty first_reader) every block comes from HBM.
std::vector<KvTile> kv_tiles(const std::vector<int>& kept, int block, int tile_blocks, int kv_seq,
                             const std::vector<int>& first_reader, int q_tile) {
  std::vector<KvTile> tiles;
  for (std::size_t i = 0; i < kept.size(); i += static_cast<std::size_t>(tile_blocks)) {
    KvTile tile;
    const std::size_t end = std::min(kept.size(), i + static_cast<std::size_t>(tile_blocks));
    int previous_level = -1;  // 0 HBM, 1 L2, of the previous block when adjacent
    for (std::size_t j = i; j < end; ++j) {
      const int tokens = std::min(block, kv_seq - kept[j] * block);
      const bool hbm =
          first_reader.empty() || first_reader[static_cast<std::size_t>(kept[j])] == q_tile;
      const int level = hbm ? 0 : 1;
      const bool new_run = j == i || kept[j] != kept[j - 1] + 1 || level != previous_level;
      tile.tokens += tokens;
      if (hbm) {
        tile.hbm_tokens += tokens;
        tile.hbm_runs += new_run;
      } else {
        tile.l2_tokens += tokens;
        tile.l2_runs += new_run;
      }
      previous_level = level;
    }
    tiles.push_back(tile);
  }
  return tiles;
}

/// Bytes per element of q, k, v and P.
int element_bytes(const FaConfig& config) { return config.int8 ? 1 : 2; }

/// Keys per stage: two blocks when q and double-buffered K, V and P tiles fit L1, else one.
int choose_kv_tile(const FaConfig& config, const HwParams& hw) {
  const double e = element_bytes(config);
  for (const int tokens : {2 * config.block, config.block}) {
    const double l1 = config.block * config.dim * e +                         // q
                      2 * 2 * static_cast<double>(tokens) * config.dim * e +  // K, V
                      2 * static_cast<double>(config.block) * tokens * e;     // P
    if (l1 <= hw.l1_bytes) return tokens;
  }
  throw SimError("dim " + std::to_string(config.dim) + " needs more L1 than l1_bytes (" +
                 number_text(hw.l1_bytes) + ") for one KV block of q, K, V and P tiles");
}

HeadPattern library_pattern(FaPattern pattern) {
  switch (pattern) {
    case FaPattern::spatial:
      return HeadPattern::spatial;
    case FaPattern::temporal:
      return HeadPattern::temporal;
    case FaPattern::textural:
      return HeadPattern::textural;
    case FaPattern::dense:
      break;
  }
  return HeadPattern::dense;
}

/// The kept KV blocks of every query tile under one RainFusion pattern: a block is kept when
/// it meets the sink or the window of any query in the tile, in the pattern's token order (as
/// the CPU kernel walks it).
std::vector<std::vector<int>> rainfusion_blocks(const sparse::PatternPlan& plan, int tokens,
                                                int block) {
  const int blocks = (tokens + block - 1) / block;
  std::vector<std::vector<int>> kept(static_cast<std::size_t>(blocks));
  const int sink_blocks = static_cast<int>((plan.sink_end + block - 1) / block);
  std::vector<int> cover(static_cast<std::size_t>(blocks) + 1);
  for (int q_tile = 0; q_tile < blocks; ++q_tile) {
    std::fill(cover.begin(), cover.end(), 0);
    const int first = q_tile * block, last = std::min(tokens, first + block);
    for (int p = first; p < last; ++p) {
      const int begin = plan.window[2 * static_cast<std::size_t>(p)];
      const int end = plan.window[2 * static_cast<std::size_t>(p) + 1];
      if (end <= begin) continue;
      ++cover[static_cast<std::size_t>(begin / block)];
      --cover[static_cast<std::size_t>((end - 1) / block + 1)];
    }
    int running = 0;
    for (int j = 0; j < blocks; ++j) {
      running += cover[static_cast<std::size_t>(j)];
      if (running > 0 || j < sink_blocks) kept[static_cast<std::size_t>(q_tile)].push_back(j);
    }
  }
  return kept;
}

/// A uniform kept share: max(1, round(density x blocks)) evenly spaced blocks per query tile.
std::vector<std::vector<int>> uniform_blocks(double density, int q_tiles, int kv_blocks) {
  const int keep = std::max(1, static_cast<int>(std::lround(density * kv_blocks)));
  std::vector<int> row;
  for (int t = 0; t < keep; ++t)
    row.push_back(static_cast<int>(static_cast<long long>(t) * kv_blocks / keep));
  return std::vector<std::vector<int>>(static_cast<std::size_t>(q_tiles), row);
}

class FaBuilder : private ProgramBuilder {
 public:
  FaBuilder(const FaConfig& config, const HwParams& hw, const FaPlan& plan)
      : ProgramBuilder(config.cores, hw, config.mode), config_(config), plan_(plan) {
    program_.cross_flag_names[kFlagQkReady] = "QK_READY";
    program_.cross_flag_names[kFlagSoftmaxReady] = "SOFTMAX_READY";
    program_.cross_flag_names[kFlagUpdateReady] = "UPDATE_READY";
    program_.mirrored_aivs = config.mode == SimMode::coarse;
  }

  /// `expected_instructions`: storage reserved up front (the estimate; 0 reserves nothing).
  Program build(std::uint64_t expected_instructions) {
    program_.reserve(static_cast<std::size_t>(expected_instructions));
    cores_.resize(static_cast<std::size_t>(config_.cores));
    for (int core = 0; core < config_.cores; ++core) init_core(core);
    sched::ScheduleOptions options;
    options.interleave_cube = config_.opts.cube_reorder;
    const int tile_blocks = plan_.kv_tile_tokens / config_.block;
    for (const FaTask& task : plan_.tasks) {
      const auto& kept =
          plan_.kept[static_cast<std::size_t>(task.mask)][static_cast<std::size_t>(task.q_tile)];
      const std::vector<KvTile> tiles =
          kv_tiles(kept, config_.block, tile_blocks, kv_tokens(config_),
                   plan_.first_reader[static_cast<std::size_t>(task.mask)], task.q_tile);
      emit_task(task, tiles,
                sched::make_schedule(static_cast<int>(tiles.size()), config_.chunk, options));
    }
    return take();
  }

  /// Coarse mode: a KV tile's cost on its busier unit (the AIC's QK + PV, or one AIV's
  /// SM + UP: their holds without contention), for the RainFusion breakdown. Builds nothing.
  double tile_cost(const KvTile& tile, int rows) {
    if (cores_.empty()) {
      cores_.resize(1);
      init_core(0);
    }
    FaTask task;
    task.rows = rows;
    const double cube = stage_hold(0, 0, tile_key(kQk, tile, rows, false, true),
                                   [&] { emit_qk(task, tile, 0, true); }) +
                        stage_hold(0, 0, tile_key(kPv, tile, rows, true, true),
                                   [&] { emit_pv(task, tile, 0, true, true); });
    const int aiv_rows0 = aiv_rows(task, 0);
    const KvTile tokens_only{tile.tokens, 0, 0, 0, 0};
    const double vector =
        stage_hold(0, 1, tile_key(kSm, tokens_only, aiv_rows0, true, true),
                   [&] { emit_sm(task, tile, 0, 0, true, true); }) +
        stage_hold(0, 1, {{kUp, aiv_rows0, 1}}, [&] { emit_up(task, 0, 0, true); });
    return std::max(cube, vector);
  }

 private:
  void init_core(int core) {
    StagedRingLayout layout;
    layout.v_tiles = true;
    layout.o_tmp_slots = config_.opts.up_pingpong ? 2 : 1;
    cores_[static_cast<std::size_t>(core)] = make_staged_rings(layout);
  }

  bool flag_at_group_start(const sched::StageInstance& item) const {
    return !config_.opts.sync_reduce || item.sub == 0;
  }
  bool flag_at_group_end(const sched::StageInstance& item, int tiles) const {
    return !config_.opts.sync_reduce || item.sub == config_.chunk - 1 || item.block == tiles - 1;
  }

  void matmul(int core, const Matmul& mm) {
    StagedRings& rings = cores_[static_cast<std::size_t>(core)];
    emit_matmul(core, mm, rings.l0, rings.l0c, config_.opts.unit_flag ? kUnitFlagPieces : 1);
  }

  /// K or V tile -> L1: the first-read blocks from HBM, the re-read ones from L2, one copy per
  /// contiguous run of each; returns the ring slot.
  int load_kv(int core, Ring& ring, const KvTile& tile, StageTag stage, int block,
              std::uint32_t hbm_text, std::uint32_t l2_text) {
    const double bytes_per_token = static_cast<double>(config_.dim) * element_bytes(config_);
    const int slot = acquire(core, ring, stage, block);
    bool allocated = false;
    const auto copies = [&](int tokens, int runs, MemLevel level, std::uint32_t text) {
      for (int run = 0; run < runs; ++run) {
        gm_read(core, 0, stage, block, text, tokens * bytes_per_token / runs, level, false,
                allocated ? Buffer::none : Buffer::l1, allocated ? 0 : kv_tile_bytes());
        allocated = true;
      }
    };
    copies(tile.hbm_tokens, tile.hbm_runs, MemLevel::hbm, hbm_text);
    copies(tile.l2_tokens, tile.l2_runs, MemLevel::l2, l2_text);
    ready(core, ring, slot, stage, block);
    await(core, ring, slot, stage, block);
    return slot;
  }

  double kv_tile_bytes() const {
    return static_cast<double>(plan_.kv_tile_tokens) * config_.dim * element_bytes(config_);
  }

  // Coarse mode folds each stage once per distinct key (ProgramBuilder::stage).
  enum StageKind : std::int32_t { kLoadQ, kReleaseQ, kQk, kPv, kHoldO, kSm, kUp, kStoreO };

  static StageKey tile_key(StageKind kind, const KvTile& tile, int rows, bool wait, bool set) {
    return {{kind, tile.tokens, tile.hbm_tokens, tile.hbm_runs, tile.l2_tokens, tile.l2_runs, rows,
             (wait ? 1 : 0) + (set ? 2 : 0)}};
  }

  void emit_task(const FaTask& task, const std::vector<KvTile>& tiles,
                 const sched::Schedule& schedule) {
    const int core = task.core;
    StagedRings& rings = cores_[static_cast<std::size_t>(core)];
    const int count = static_cast<int>(tiles.size());
    const double q_bytes = static_cast<double>(task.rows) * config_.dim * element_bytes(config_);
    stage(core, 0, -1, {{kLoadQ, task.rows}}, [&] {
      acquire(core, rings.q_tile, StageTag::setup, -1);
      gm_read(core, 0, StageTag::setup, -1, label("load q (HBM->L1)"), q_bytes, MemLevel::hbm,
              false, Buffer::l1, q_bytes);
      ready(core, rings.q_tile, 0, StageTag::setup, -1);
      await(core, rings.q_tile, 0, StageTag::setup, -1);
    });
    for (const sched::StageInstance& item : schedule.cube) {
      const KvTile& tile = tiles[static_cast<std::size_t>(item.block)];
      if (item.stage == sched::Stage::qk) {
        const bool set = flag_at_group_end(item, count);
        stage(core, 0, item.block, tile_key(kQk, tile, task.rows, false, set),
              [&] { emit_qk(task, tile, item.block, set); });
      } else {
        const bool wait = flag_at_group_start(item), set = flag_at_group_end(item, count);
        stage(core, 0, item.block, tile_key(kPv, tile, task.rows, wait, set),
              [&] { emit_pv(task, tile, item.block, wait, set); });
      }
    }
    stage(core, 0, -1, {{kReleaseQ, task.rows}},
          [&] { release(core, rings.q_tile, 0, StageTag::setup, -1, Buffer::l1, q_bytes); });
    // Coarse mode: AIV0's stages stand for AIV1's (Program::mirrored_aivs), the same work on the
    // other half of the rows, one row fewer in an odd tile.
    const int aivs = program_.mirrored_aivs ? 1 : 2;
    for (int aiv = 0; aiv < aivs; ++aiv) emit_vector(task, tiles, schedule, aiv);
  }

  void emit_qk(const FaTask& task, const KvTile& tile, int block, bool set) {
    const int core = task.core;
    StagedRings& rings = cores_[static_cast<std::size_t>(core)];
    const double e = element_bytes(config_);
    const int k_slot =
        load_kv(core, rings.k_tiles, tile, StageTag::qk, block, label("QK load K tile (HBM->L1)"),
                label("QK load K tile (L2 hit->L1)"));
    matmul(core, Matmul{task.rows, tile.tokens, config_.dim, e, e, config_.int8, StageTag::qk,
                        block, "S"});
    release(core, rings.k_tiles, k_slot, StageTag::qk, block, Buffer::l1, kv_tile_bytes());
    if (set) set_cross(core, 0, Pipe::fix, kFlagQkReady, 2, StageTag::qk, block);
  }

  void emit_pv(const FaTask& task, const KvTile& tile, int block, bool wait, bool set) {
    const int core = task.core;
    StagedRings& rings = cores_[static_cast<std::size_t>(core)];
    const double e = element_bytes(config_);
    if (wait) wait_cross(core, 0, Pipe::mte2, kFlagSoftmaxReady, StageTag::pv, block);
    const double p_tile = static_cast<double>(config_.block) * plan_.kv_tile_tokens * e;
    const int p_slot = acquire(core, rings.p_tiles, StageTag::pv, block);
    gm_read(core, 0, StageTag::pv, block, label("PV load P (L2->L1)"),
            static_cast<double>(task.rows) * tile.tokens * e, MemLevel::l2,
            !config_.opts.int8_layout, Buffer::l1, p_tile);
    ready(core, rings.p_tiles, p_slot, StageTag::pv, block);
    await(core, rings.p_tiles, p_slot, StageTag::pv, block);
    const int v_slot =
        load_kv(core, rings.v_tiles, tile, StageTag::pv, block, label("PV load V tile (HBM->L1)"),
                label("PV load V tile (L2 hit->L1)"));
    matmul(core, Matmul{task.rows, config_.dim, tile.tokens, e, e, config_.int8, StageTag::pv,
                        block, "O_tmp"});
    release(core, rings.p_tiles, p_slot, StageTag::pv, block, Buffer::l1, p_tile);
    release(core, rings.v_tiles, v_slot, StageTag::pv, block, Buffer::l1, kv_tile_bytes());
    if (set) set_cross(core, 0, Pipe::fix, kFlagUpdateReady, 2, StageTag::pv, block);
  }

  // AIV0 takes the odd row; a one-row tile still runs on both AIVs (mode-2 flags need both).
  int aiv_rows(const FaTask& task, int aiv) const {
    return aiv == 0 ? (task.rows + 1) / 2 : std::max(1, task.rows / 2);
  }

  void emit_vector(const FaTask& task, const std::vector<KvTile>& tiles,
                   const sched::Schedule& schedule, int aiv) {
    const int core = task.core;
    const int unit = aiv + 1;
    StagedRings& rings = cores_[static_cast<std::size_t>(core)];
    const int rows = aiv_rows(task, aiv);
    const int count = static_cast<int>(tiles.size());
    const double o_bytes = static_cast<double>(rows) * config_.dim * kAccBytes;
    // The running O stays in UB for the whole task.
    int o_slot = 0;
    stage(core, unit, -1, {{kHoldO, rows}}, [&] {
      o_slot = acquire(core, rings.o_acc[aiv], StageTag::up, -1);
      ready(core, rings.o_acc[aiv], o_slot, StageTag::up, -1, Buffer::ub, o_bytes);
      await(core, rings.o_acc[aiv], o_slot, StageTag::up, -1);
    });
    for (const sched::StageInstance& item : schedule.vector) {
      const KvTile& tile = tiles[static_cast<std::size_t>(item.block)];
      const bool wait = flag_at_group_start(item);
      if (item.stage == sched::Stage::sm) {
        const bool set = flag_at_group_end(item, count);
        // SM reads S and writes P through L2 only: the tile's HBM/L2 split does not matter.
        const KvTile tokens_only{tile.tokens, 0, 0, 0, 0};
        stage(core, unit, item.block, tile_key(kSm, tokens_only, rows, wait, set),
              [&] { emit_sm(task, tile, item.block, aiv, wait, set); });
      } else {
        stage(core, unit, item.block, {{kUp, rows, wait ? 1 : 0}},
              [&] { emit_up(task, item.block, aiv, wait); });
      }
    }
    stage(core, unit, count - 1, {{kStoreO, rows}}, [&] {
      compute(core, unit, Pipe::v, StageTag::up, count - 1, label("UP normalize O"),
              vector_cycles(kUpFinalPasses, o_bytes, 2));
      set_event(core, unit, Pipe::v, Pipe::mte3, 2, StageTag::up, count - 1);
      wait_event(core, unit, Pipe::v, Pipe::mte3, 2, StageTag::up, count - 1,
                 label("wait O computed"));
      gm_write(core, unit, StageTag::up, count - 1, label("UP store O (UB->GM)"),
               static_cast<double>(rows) * config_.dim * kOutBytes);
      release(core, rings.o_acc[aiv], o_slot, StageTag::up, count - 1, Buffer::ub, o_bytes);
    });
  }

  void emit_sm(const FaTask& task, const KvTile& tile, int block, int aiv, bool wait, bool set) {
    const int core = task.core;
    const int unit = aiv + 1;
    StagedRings& rings = cores_[static_cast<std::size_t>(core)];
    const int rows = aiv_rows(task, aiv);
    const double e = element_bytes(config_);
    const std::uint32_t load_s = label("SM load S (L2->UB)");
    const std::uint32_t softmax = label("SM softmax + cast P");
    const std::uint32_t store_p = label("SM store P (UB->L2)");
    if (wait) wait_cross(core, unit, Pipe::mte2, kFlagQkReady, StageTag::sm, block);
    for (int row0 = 0; row0 < rows; row0 += sm_rows_) {
      const int step = std::min(sm_rows_, rows - row0);
      const double s_tile = static_cast<double>(sm_rows_) * plan_.kv_tile_tokens * kAccBytes;
      const double s_bytes = static_cast<double>(step) * tile.tokens * kAccBytes;
      const double p_tile = static_cast<double>(sm_rows_) * plan_.kv_tile_tokens * e;
      const int slot = acquire(core, rings.s_in[aiv], StageTag::sm, block);
      gm_read(core, unit, StageTag::sm, block, load_s, s_bytes, MemLevel::l2, false, Buffer::ub,
              s_tile);
      ready(core, rings.s_in[aiv], slot, StageTag::sm, block);
      await(core, rings.s_in[aiv], slot, StageTag::sm, block);
      const int p_slot = acquire(core, rings.p_out[aiv], StageTag::sm, block);
      const double passes =
          kSmElementwisePasses + kSmReductionPasses + (config_.int8 ? kSmInt8Passes : 0);
      compute(core, unit, Pipe::v, StageTag::sm, block, softmax,
              vector_cycles(passes, s_bytes, kSmInstrs), Buffer::ub, p_tile);
      release(core, rings.s_in[aiv], slot, StageTag::sm, block, Buffer::ub, s_tile);
      ready(core, rings.p_out[aiv], p_slot, StageTag::sm, block);
      await(core, rings.p_out[aiv], p_slot, StageTag::sm, block);
      gm_write(core, unit, StageTag::sm, block, store_p,
               static_cast<double>(step) * tile.tokens * e);
      release(core, rings.p_out[aiv], p_slot, StageTag::sm, block, Buffer::ub, p_tile);
    }
    if (set) set_cross(core, unit, Pipe::mte3, kFlagSoftmaxReady, 2, StageTag::sm, block);
  }

  void emit_up(const FaTask& task, int block, int aiv, bool wait) {
    const int core = task.core;
    const int unit = aiv + 1;
    StagedRings& rings = cores_[static_cast<std::size_t>(core)];
    const double o_bytes = static_cast<double>(aiv_rows(task, aiv)) * config_.dim * kAccBytes;
    if (wait) wait_cross(core, unit, Pipe::mte2, kFlagUpdateReady, StageTag::up, block);
    const int slot = acquire(core, rings.o_tmp[aiv], StageTag::up, block);
    gm_read(core, unit, StageTag::up, block, label("UP load O_tmp (L2->UB)"), o_bytes, MemLevel::l2,
            false, Buffer::ub, o_bytes);
    ready(core, rings.o_tmp[aiv], slot, StageTag::up, block);
    await(core, rings.o_tmp[aiv], slot, StageTag::up, block);
    compute(core, unit, Pipe::v, StageTag::up, block, label("UP rescale O + add O_tmp"),
            vector_cycles(kUpPasses, o_bytes, kUpInstrs));
    release(core, rings.o_tmp[aiv], slot, StageTag::up, block, Buffer::ub, o_bytes);
  }

  const FaConfig& config_;
  const FaPlan& plan_;
  std::vector<StagedRings> cores_;
  int sm_rows_ = kSmRows;
};

}  // namespace

const char* fa_pattern_name(FaPattern pattern) noexcept {
  switch (pattern) {
    case FaPattern::dense:
      return "dense";
    case FaPattern::spatial:
      return "spatial";
    case FaPattern::temporal:
      return "temporal";
    case FaPattern::textural:
      return "textural";
  }
  return "?";
}

std::vector<FaPattern> parse_fa_patterns(const std::string& list) {
  std::vector<FaPattern> patterns;
  std::stringstream stream(list);
  std::string name;
  while (std::getline(stream, name, ',')) {
    bool found = false;
    for (const FaPattern pattern :
         {FaPattern::dense, FaPattern::spatial, FaPattern::temporal, FaPattern::textural}) {
      if (name == fa_pattern_name(pattern)) {
        patterns.push_back(pattern);
        found = true;
      }
    }
    if (!found) {
      throw SimError("unknown pattern '" + name + "' (known: spatial temporal textural dense)");
    }
  }
  if (patterns.empty()) throw SimError("needs at least one pattern");
  return patterns;
}

void validate(const FaConfig& config, const HwParams& hw) {
  const auto check = [](const char* name, long long value, long long low, long long high) {
    if (value < low || value > high) {
      throw SimError(std::string(name) + " must be in [" + std::to_string(low) + ", " +
                     std::to_string(high) + "] (got " + std::to_string(value) + ")");
    }
  };
  check("batch", config.batch, 1, 4096);
  check("heads", config.heads, 1, 1024);
  check("seq", config.seq, 1, 1 << 20);
  check("kv-seq", config.kv_seq, 0, 1 << 20);
  check("dim", config.dim, 16, 512);
  if (config.dim % 16 != 0) {
    throw SimError("dim must be a multiple of 16 (got " + std::to_string(config.dim) + ")");
  }
  check("cores", config.cores, 1, static_cast<long long>(hw.num_cores));
  // The block masks hold up to one entry per (query tile, KV block) and pattern.
  const long long pairs = (config.seq + config.block - 1LL) / config.block *
                          ((kv_tokens(config) + config.block - 1LL) / config.block);
  if (pairs > kMaxMaskPairs) {
    throw SimError("seq x kv-seq has " + std::to_string(pairs) +
                   " (query tile, KV block) pairs, more than the limit of " +
                   std::to_string(kMaxMaskPairs) + " (seq = kv-seq = 524288)");
  }
  if (!schedule::valid_chunk(config.chunk)) {
    throw SimError("chunk must be 1, 2 or 4 (got " + std::to_string(config.chunk) + ")");
  }
  if (!(config.density > 0 && config.density <= 1)) {
    throw SimError("density must be in (0, 1] (got " + number_text(config.density) + ")");
  }
  if (config.rainfusion) {
    check("video frames", config.frames, 1, 1 << 20);
    check("video height", config.height, 1, 1 << 20);
    check("video width", config.width, 1, 1 << 20);
    check("text", config.text, 0, 1 << 20);
    if (!(config.sparsity >= 0 && config.sparsity < 1)) {
      throw SimError("sparsity must be in [0, 1) (got " + number_text(config.sparsity) + ")");
    }
    const long long tokens =
        static_cast<long long>(config.frames) * config.height * config.width + config.text;
    if (tokens != config.seq || (config.kv_seq != 0 && config.kv_seq != config.seq)) {
      throw SimError("video " + std::to_string(config.frames) + "," +
                     std::to_string(config.height) + "," + std::to_string(config.width) +
                     " + text " + std::to_string(config.text) + " is " + std::to_string(tokens) +
                     " tokens; seq (and kv-seq) must equal it (self-attention)");
    }
  }
  if (hw.cross_core_flag_ids <= kFlagUpdateReady) {
    throw SimError("flash attention needs at least " + std::to_string(kFlagUpdateReady + 1) +
                   " cross-core flag ids");
  }
  if (hw.intra_core_event_ids < 8) {
    throw SimError("flash attention needs 8 intra-core event ids per pipe pair");
  }
  choose_kv_tile(config, hw);
}

namespace {

std::vector<FaPattern> head_patterns(const FaConfig& config) {
  if (!config.rainfusion) return {FaPattern::dense};
  if (!config.patterns.empty()) return config.patterns;
  return {FaPattern::spatial, FaPattern::temporal, FaPattern::textural};
}

/// The block masks (FaPlan::kept and mask_names), one per pattern.
void plan_masks(const FaConfig& config, FaPlan& plan) {
  if (!config.rainfusion) {
    plan.mask_names = {config.density < 1 ? "uniform" : "dense"};
    plan.kept.push_back(uniform_blocks(config.density, plan.q_tiles, plan.kv_blocks));
    return;
  }
  RainFusionOptions rf;
  rf.video = {config.frames, config.height, config.width, config.text, true};
  rf.sparsity = static_cast<float>(config.sparsity);
  try {
    const sparse::Layout layout = sparse::checked_layout("ditops-sim fa", rf);
    for (const FaPattern pattern : head_patterns(config)) {
      plan.mask_names.push_back(fa_pattern_name(pattern));
      const sparse::PatternPlan pattern_plan =
          sparse::plan_pattern(library_pattern(pattern), layout);
      plan.kept.push_back(rainfusion_blocks(pattern_plan, config.seq, config.block));
    }
  } catch (const Error& error) {
    throw SimError(error.what());
  }
}

/// K/V reuse through L2: the query tiles of one head run close together in time (tasks are
/// dealt in (batch, head, query tile) order), so the K and V a head's first reader brought in
/// are re-read from L2, provided the K and V of the heads in flight (about cores / query tiles
/// + 1 of them) fit in L2. Otherwise every read goes to HBM.
void plan_reuse(const FaConfig& config, const HwParams& hw, FaPlan& plan) {
  const double heads_in_flight =
      std::min(static_cast<double>(config.batch) * config.heads,
               std::ceil(static_cast<double>(config.cores) / plan.q_tiles) + 1);
  const double per_head = 2.0 * kv_tokens(config) * config.dim * element_bytes(config);
  plan.kv_reuse = heads_in_flight * per_head <= hw.l2_bytes;
  plan.first_reader.assign(plan.kept.size(), {});
  if (!plan.kv_reuse) return;
  for (std::size_t mask = 0; mask < plan.kept.size(); ++mask) {
    std::vector<int>& first = plan.first_reader[mask];
    first.assign(static_cast<std::size_t>(plan.kv_blocks), -1);
    for (int q_tile = 0; q_tile < plan.q_tiles; ++q_tile) {
      for (const int block : plan.kept[mask][static_cast<std::size_t>(q_tile)]) {
        if (first[static_cast<std::size_t>(block)] < 0)
          first[static_cast<std::size_t>(block)] = q_tile;
      }
    }
  }
}

FaPlan plan_shape(const FaConfig& config, const HwParams& hw) {
  validate(config, hw);
  FaPlan plan;
  plan.q_tiles = (config.seq + config.block - 1) / config.block;
  plan.kv_blocks = (kv_tokens(config) + config.block - 1) / config.block;
  plan.kv_tile_tokens = choose_kv_tile(config, hw);
  plan_masks(config, plan);
  plan_reuse(config, hw, plan);
  return plan;
}

}  // namespace

FaPlan plan_fa(const FaConfig& config, const HwParams& hw) {
  FaPlan plan = plan_shape(config, hw);
  const auto patterns = head_patterns(config);
  std::vector<double> costs;
  double kept_pairs = 0;
  for (int batch = 0; batch < config.batch; ++batch) {
    for (int head = 0; head < config.heads; ++head) {
      for (int q_tile = 0; q_tile < plan.q_tiles; ++q_tile) {
        FaTask task;
        task.batch = batch;
        task.head = head;
        task.q_tile = q_tile;
        task.rows = std::min(config.block, config.seq - q_tile * config.block);
        task.mask = head % static_cast<int>(patterns.size());
        const auto blocks =
            plan.kept[static_cast<std::size_t>(task.mask)][static_cast<std::size_t>(q_tile)].size();
        kept_pairs += static_cast<double>(blocks);
        // Rows x (kept keys + one block of pipeline fill), as for the MLA tasks.
        costs.push_back(static_cast<double>(task.rows) * (static_cast<double>(blocks) + 1) *
                        config.block);
        plan.tasks.push_back(task);
      }
    }
  }
  plan.kept_share = kept_pairs / (static_cast<double>(plan.tasks.size()) * plan.kv_blocks);
  std::vector<FaTask> ordered;
  const auto assignment = assign_longest_first(costs, config.cores);
  for (std::size_t core = 0; core < assignment.size(); ++core) {
    if (!assignment[core].empty()) ++plan.cores_used;
    for (const std::size_t index : assignment[core]) {
      ordered.push_back(plan.tasks[index]);
      ordered.back().core = static_cast<int>(core);
    }
  }
  plan.tasks = std::move(ordered);
  return plan;
}

namespace {

/// Instructions of the program for `plan`, counted without building it: one-task builds (a full
/// query tile over 4 and 12 full KV tiles) give the instructions per task and per tile that
/// reads its K and V from HBM; a build of two query tiles of one head (the second hits L2) the
/// instructions per tile of L2 hits (coarse mode folds a tile that reads both levels into more
/// events).
std::uint64_t estimate_from_plan(const FaConfig& config, const HwParams& hw, const FaPlan& plan) {
  FaConfig probe = config;
  probe.batch = 1;
  probe.heads = 1;
  probe.cores = 1;
  probe.density = 1;
  probe.rainfusion = false;
  const auto probe_size = [&](int q_tiles, int tiles) {
    probe.seq = q_tiles * config.block;
    probe.kv_seq = tiles * plan.kv_tile_tokens;
    const FaPlan probe_plan = plan_fa(probe, hw);
    return static_cast<double>(FaBuilder(probe, hw, probe_plan).build(0).instrs.size());
  };
  const double few = probe_size(1, 4), many = probe_size(1, 12);
  const double per_hbm_tile = (many - few) / 8, per_task = few - 4 * per_hbm_tile;
  const double per_l2_tile = (probe_size(2, 4) - 2 * per_task - 4 * per_hbm_tile) / 4;
  const int tile_blocks = plan.kv_tile_tokens / config.block;
  const auto patterns = head_patterns(config);
  double hbm_tiles = 0, l2_tiles = 0;
  for (int head = 0; head < config.heads; ++head) {
    const std::size_t mask = static_cast<std::size_t>(head) % patterns.size();
    for (int q_tile = 0; q_tile < plan.q_tiles; ++q_tile) {
      for (const KvTile& tile :
           kv_tiles(plan.kept[mask][static_cast<std::size_t>(q_tile)], config.block, tile_blocks,
                    kv_tokens(config), plan.first_reader[mask], q_tile)) {
        (tile.hbm_tokens > 0 ? hbm_tiles : l2_tiles) += 1;
      }
    }
  }
  const double tasks = static_cast<double>(config.batch) * config.heads * plan.q_tiles;
  return static_cast<std::uint64_t>(
      per_task * tasks + config.batch * (per_hbm_tile * hbm_tiles + per_l2_tile * l2_tiles));
}

}  // namespace

Program build_fa_program(const FaConfig& config, const HwParams& hw, FaPlan* plan_out) {
  FaPlan plan = plan_fa(config, hw);  // moved out at the end, after the build that reads it
  FaBuilder builder(config, hw, plan);
  // A little above the estimate: one growth step of a vector this size would copy all of it.
  const std::uint64_t estimate = estimate_from_plan(config, hw, plan);
  Program program = builder.build(estimate + estimate / 32);
  if (plan_out != nullptr) *plan_out = std::move(plan);
  return program;
}

FaBreakdown rainfusion_breakdown(const FaConfig& config, const HwParams& hw, const FaPlan& plan,
                                 double time_us) {
  FaBreakdown breakdown;
  breakdown.ideal_speedup = 1 / (1 - config.sparsity);
  if (!config.rainfusion) return breakdown;
  FaConfig coarse = config;
  coarse.mode = SimMode::coarse;
  FaBuilder costing(coarse, hw, plan);
  std::map<std::array<int, 6>, double> costs;
  const auto cost = [&](const KvTile& tile, int rows) {
    const std::array<int, 6> key{tile.tokens,    tile.hbm_tokens, tile.hbm_runs,
                                 tile.l2_tokens, tile.l2_runs,    rows};
    const auto found = costs.find(key);
    if (found != costs.end()) return found->second;
    return costs[key] = costing.tile_cost(tile, rows);
  };
  // Cycles per kept key of a full tile of L2 hits, one copy run each for K and V: the cost the
  // ideal share would run at.
  const int full = plan.kv_tile_tokens;
  const double per_key = cost({full, 0, 0, full, 1}, config.block) / full;
  // Text and frame 0 come first in every pattern's order: every query attends them, and their
  // queries attend every key (ops/sparse/layout).
  const long long sink_end = static_cast<long long>(config.text) + config.height * config.width;
  const long long kv = kv_tokens(config);
  const int tile_blocks = plan.kv_tile_tokens / config.block;
  // Every task of a (mask, query tile) has the same tiles: count them, cost each once.
  std::map<std::pair<int, int>, double> tasks_of;
  for (const FaTask& task : plan.tasks) tasks_of[{task.mask, task.q_tile}] += 1;
  double keys = 0, sink_keys = 0, window_keys = 0, kept_sink = 0, kept_window = 0;
  double first_reads = 0, partial = 0, index = 0, tiles = 0, work = 0;
  for (const auto& [where, count] : tasks_of) {
    const auto [mask, q_tile] = where;
    const int rows = std::min(config.block, config.seq - q_tile * config.block);
    const bool sink_rows = static_cast<long long>(q_tile) * config.block < sink_end;
    const auto& kept = plan.kept[static_cast<std::size_t>(mask)][static_cast<std::size_t>(q_tile)];
    keys += count * static_cast<double>(kv);
    sink_keys += count * static_cast<double>(sink_rows ? kv : std::min(sink_end, kv));
    window_keys += count * static_cast<double>(sink_rows ? 0 : kv - std::min(sink_end, kv));
    for (const int block : kept) {
      const double tokens =
          static_cast<double>(std::min<long long>(config.block, kv - block * 1LL * config.block));
      (sink_rows || static_cast<long long>(block) * config.block < sink_end ? kept_sink
                                                                            : kept_window) +=
          count * tokens;
    }
    for (const KvTile& tile : kv_tiles(kept, config.block, tile_blocks, static_cast<int>(kv),
                                       plan.first_reader[static_cast<std::size_t>(mask)], q_tile)) {
      // The same keys in one copy run per level, and a full tile with the same level mix.
      const KvTile one_run{tile.tokens, tile.hbm_tokens, tile.hbm_tokens > 0 ? 1 : 0,
                           tile.l2_tokens, tile.l2_tokens > 0 ? 1 : 0};
      const int full_hbm =
          static_cast<int>(std::lround(static_cast<double>(full) * tile.hbm_tokens / tile.tokens));
      const KvTile full_mix{full, full_hbm, full_hbm > 0 ? 1 : 0, full - full_hbm,
                            full - full_hbm > 0 ? 1 : 0};
      const double mixed_per_key = cost(full_mix, config.block) / full;
      first_reads += count * (mixed_per_key - per_key) * tile.tokens;
      partial += count * (cost(one_run, rows) - mixed_per_key * tile.tokens);
      index += count * (cost(tile, rows) - cost(one_run, rows));
      tiles += count;
      work += count * cost(tile, rows);
    }
  }
  const double s = config.sparsity;
  // The simulated time on the cores beyond the tiles' cost (flag hand-offs, the pipeline's fill
  // and drain, shared-bandwidth contention, imbalance) is charged per KV tile: a key then costs
  // its share of a full tile's, and a partial tile the rest of its own.
  const double simulated = time_us * cycles_per_us(hw) * std::max(1, plan.cores_used);
  const double per_tile = tiles > 0 ? std::max(0.0, simulated - work) / tiles : 0;
  const double key = per_key + per_tile / full;
  const double kept_keys = kept_sink + kept_window;
  // In cycles summed over the cores; they add up to the simulated time. A part the mask makes
  // negative (fewer window keys than the ideal share, a partial query tile cheaper per key) is
  // taken off the ideal share instead.
  std::vector<std::pair<std::string, double>> parts = {
      {"kept keys at the ideal share (1 - sparsity)", key * (1 - s) * keys},
      {"kept keys beyond the ideal share (block granularity)",
       key * (kept_window - (1 - s) * window_keys)},
      {"text and first-frame keys (dense rows and columns)",
       key * (kept_sink - (1 - s) * sink_keys)},
      {"K/V first reads from HBM", first_reads},
      {"partial tiles (fewer than " + std::to_string(full) + " keys)",
       partial + per_tile * (tiles - kept_keys / full)},
      {"index handling (gathered K/V copy runs)", index}};
  for (auto& [name, cycles] : parts) {
    if (&cycles != &parts.front().second && cycles < 0) {
      parts.front().second += cycles;
      cycles = 0;
    }
  }
  double total = 0;
  for (auto& [name, cycles] : parts) {
    cycles = std::max(0.0, cycles);
    total += cycles;
  }
  for (const auto& [name, cycles] : parts) {
    breakdown.parts.push_back({name, total > 0 ? cycles * time_us / total : 0});
  }
  return breakdown;
}

std::uint64_t estimate_fa_instructions(const FaConfig& config, const HwParams& hw) {
  // From the masks alone: the tasks (batch x heads x query tiles) are counted, not built.
  return estimate_from_plan(config, hw, plan_shape(config, hw));
}

std::string describe(const FaConfig& config) {
  std::string mask;
  if (config.rainfusion) {
    mask = "video " + std::to_string(config.frames) + "x" + std::to_string(config.height) + "x" +
           std::to_string(config.width) + " + text " + std::to_string(config.text) + ", sparsity " +
           number_text(config.sparsity) + ", patterns ";
    const std::vector<FaPattern> patterns =
        config.patterns.empty()
            ? std::vector<FaPattern>{FaPattern::spatial, FaPattern::temporal, FaPattern::textural}
            : config.patterns;
    for (std::size_t i = 0; i < patterns.size(); ++i) {
      mask += (i ? "," : "") + std::string(fa_pattern_name(patterns[i]));
    }
  } else {
    mask = config.density < 1 ? "density " + number_text(config.density) : "dense";
  }
  return "batch " + std::to_string(config.batch) + ", heads " + std::to_string(config.heads) +
         ", seq " + std::to_string(config.seq) + ", kv-seq " + std::to_string(kv_tokens(config)) +
         ", dim " + std::to_string(config.dim) + ", " + (config.int8 ? "int8" : "bf16") +
         ", cores " + std::to_string(config.cores) + ", chunk " + std::to_string(config.chunk) +
         ", " + mask + ", opts " + mla_opts_to_string(config.opts);
}

}  // namespace ditops::sim
