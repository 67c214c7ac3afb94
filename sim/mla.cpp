#include "sim/mla.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "ops/schedule/schedule.hpp"
#include "ops/schedule/split_plan.hpp"
#include "sim/builder.hpp"
#include "sim/error.hpp"

namespace ditops::sim {
namespace {

namespace sched = ditops::schedule;

// MLA shapes (DeepSeek): a 576-d latent per token, 512 int8 "nope" dims (also V) + 64 "rope".
constexpr int kNopeDim = 512;
constexpr int kRopeDim = 64;
constexpr int kRopeBytes = 2;  // bf16 rope values and q_rope
constexpr int kOutBytes = 2;   // bf16 output O

// Vector work per element, in passes over the fp32 tile (one pass = tile bytes / 256 B per
// cycle) and in vector instructions. These describe the kernel, not the chip.
constexpr double kSmDequantPasses = 2;  // int32 -> fp32 cast, per-token scale multiply
constexpr int kSmDequantInstrs = 2;
// add S_rope, softmax scale, subtract row max, exp (counted twice: exp is a multi-cycle
// sequence), quantize multiply, fp32 -> fp16 -> int8 casts
constexpr double kSmElementwisePasses = 7;
constexpr double kSmReductionPasses = 4;  // row max and row sum, each two passes (tree + final)
constexpr double kSmMaskPasses = 1;       // -inf fill of the padding of a partial block
constexpr int kSmSoftmaxInstrs = 15;      // 11 full-tile instructions + 4 per-row updates
constexpr double kUpBlockPasses = 3;      // cast O_tmp, multiply by exp(m_b - m) * scale, add
constexpr int kUpBlockInstrs = 3;
constexpr double kUpRescalePasses = 1;     // running O *= exp(m_old - m_new), once per UP pass
constexpr double kUpFinalPasses = 2;       // divide by the row sum, cast to bf16
constexpr double kCombineSplitPasses = 2;  // weight by exp(lse_s - lse), add
constexpr double kCombineFinalPasses = 2;

// Rows per vector step. The UB (192 KiB) holds two SM input tiles of rows x 128 tokens x
// (int32 S_nope + fp32 S_rope), two P tiles and up to two UP accumulator and O_tmp tiles of
// rows x 512 x fp32: 16 SM rows and 8 UP rows leave room for both ping-pong sets.
constexpr int kSmRows = 16;
constexpr int kSmRowsLarge = 32;
constexpr int kUpRows = 8;
constexpr int kUnitFlagPieces = 4;  // L0C pieces FIX drains separately under unit_flag

class MlaBuilder : private ProgramBuilder {
 public:
  MlaBuilder(const MlaConfig& config, const HwParams& hw, const MlaPlan& plan)
      : ProgramBuilder(config.cores, hw, config.mode), config_(config), plan_(plan) {
    program_.cross_flag_names[kFlagQkReady] =
        config.opts.nope_rope_split ? "QK_NOPE_READY" : "QK_READY";
    program_.cross_flag_names[kFlagQkRopeReady] = "QK_ROPE_READY";
    program_.cross_flag_names[kFlagSoftmaxReady] = "SOFTMAX_READY";
    program_.cross_flag_names[kFlagUpdateReady] = "UPDATE_READY";
    program_.cross_flag_names[kFlagCombine] = "COMBINE_BARRIER";
    sm_rows_ = config.opts.sm_head_group ? kSmRowsLarge : kSmRows;
    // The interleaved cube order (QK of the next group between the PVs of this one) needs the
    // next group's K tiles in L1 while this group's PVs still run; q and chunk + 1 tiles fill L1,
    // so a K slot would only come free after an older PV and every QK would wait on it. The
    // kernel therefore frees each K tile after its QK and re-reads the block's nope part (V) for
    // the PV. The re-read hits L2 when the blocks read chip-wide between a block's QK and its PV
    // (every core's K ring) fit in L2, which holds for any decode shape here (~10 MiB at
    // chunk 4 on 24 cores); else it goes to HBM.
    reread_v_ = config.opts.cube_reorder && config.chunk > 1;
    const double blocks_in_flight = static_cast<double>(config.cores) * (config.chunk + 1);
    v_reread_level_ =
        blocks_in_flight * k_tile_bytes() <= hw.l2_bytes ? MemLevel::l2 : MemLevel::hbm;
  }

  Program build() {
    cores_.resize(static_cast<std::size_t>(config_.cores));
    for (int core = 0; core < config_.cores; ++core) init_core(core);
    sched::ScheduleOptions schedule_options;
    schedule_options.interleave_cube = config_.opts.cube_reorder;
    for (const MlaTask& task : plan_.tasks) {
      const sched::Schedule schedule =
          sched::make_schedule(task.num_blocks, config_.chunk, schedule_options);
      emit_task(task, schedule);
    }
    if (plan_.combine) emit_combine();
    return take();
  }

 private:
  // Coarse mode folds each stage once per distinct key (ProgramBuilder::stage).
  enum StageKind : std::int32_t { kLoadQ, kQk, kPv, kSm, kUp, kBarrier, kCombine };

  // ---- rings -----------------------------------------------------------------------------------
  void init_core(int core) {
    // AIC MTE2 -> MTE1 ids: K tiles 0..chunk (with reread_v_: K 0-1, V 2-3), P 5-6, q 7.
    StagedRingLayout layout;
    layout.k_slots = reread_v_ ? 2 : config_.chunk + 1;
    layout.v_tiles = reread_v_;
    layout.p_id = 5;
    layout.q_id = 7;
    layout.o_tmp_slots = layout.o_acc_slots = config_.opts.up_pingpong ? 2 : 1;
    cores_[static_cast<std::size_t>(core)] = make_staged_rings(layout);
  }

  // Flags are per block, or per chunk group under sync_reduce.
  bool flag_at_group_start(const sched::StageInstance& item) const {
    return !config_.opts.sync_reduce || item.sub == 0;
  }
  bool flag_at_group_end(const sched::StageInstance& item, int num_blocks) const {
    return !config_.opts.sync_reduce || item.sub == config_.chunk - 1 ||
           item.block == num_blocks - 1;
  }

  int block_tokens(const MlaTask& task, int block) const {
    const int start = (task.first_block + block) * config_.block_size;
    return std::min(config_.block_size, config_.kv - start);
  }

  // One paged KV block in L1: int8 nope (also V) and bf16 rope.
  double k_tile_bytes() const {
    return static_cast<double>(config_.block_size) * kNopeDim +
           static_cast<double>(config_.block_size) * kRopeDim * kRopeBytes;
  }

  void emit_qk(const MlaTask& task, const sched::StageInstance& item) {
    const int core = task.core;
    StagedRings& rings = cores_[static_cast<std::size_t>(core)];
    const int block = item.block;
    const int tokens = block_tokens(task, block);
    const double tile_bytes = k_tile_bytes();
    const double load_bytes =
        static_cast<double>(tokens) * (kNopeDim + static_cast<double>(kRopeDim) * kRopeBytes);
    const int slot = acquire(core, rings.k_tiles, StageTag::qk, block);
    gm_read(core, 0, StageTag::qk, block, label("QK load K tile (HBM->L1)"), load_bytes,
            MemLevel::hbm, false, Buffer::l1, tile_bytes);
    ready(core, rings.k_tiles, slot, StageTag::qk, block);
    await(core, rings.k_tiles, slot, StageTag::qk, block);
    if (block == 0) await(core, rings.q_tile, 0, StageTag::qk, block);

    emit_matmul(core, Matmul{task.rows, tokens, kNopeDim, 1, 1, true, StageTag::qk, block, "nope"});
    const bool split = config_.opts.nope_rope_split;
    if (split && flag_at_group_end(item, task.num_blocks)) {
      set_cross(core, 0, Pipe::fix, kFlagQkReady, 2, StageTag::qk, block);
    }
    emit_matmul(core, Matmul{task.rows, tokens, kRopeDim, kRopeBytes, kRopeBytes, false,
                             StageTag::qk, block, "rope"});
    if (flag_at_group_end(item, task.num_blocks)) {
      set_cross(core, 0, Pipe::fix, split ? kFlagQkRopeReady : kFlagQkReady, 2, StageTag::qk,
                block);
    }
    if (reread_v_) release(core, rings.k_tiles, slot, StageTag::qk, block, Buffer::l1, tile_bytes);
    if (block == task.num_blocks - 1) {
      release(core, rings.q_tile, 0, StageTag::qk, block, Buffer::l1, q_bytes(task));
    }
  }

  // `drain`: the task's QKs are all issued, so the cube has nothing else to run while this PV
  // waits for its SM. Those waits are the pipeline's drain bubble and are reported apart
  // ("SOFTMAX_READY (drain)").
  void emit_pv(const MlaTask& task, const sched::StageInstance& item, bool drain) {
    const int core = task.core;
    StagedRings& rings = cores_[static_cast<std::size_t>(core)];
    const int block = item.block;
    const int tokens = block_tokens(task, block);
    if (flag_at_group_start(item)) {
      wait_cross(core, 0, Pipe::mte2, kFlagSoftmaxReady, StageTag::pv, block,
                 drain ? label("SOFTMAX_READY (drain)") : 0);
    }
    const double p_tile = static_cast<double>(task.rows) * config_.block_size;
    const int slot = acquire(core, rings.p_tiles, StageTag::pv, block);
    gm_read(core, 0, StageTag::pv, block, label("PV load P (L2->L1)"),
            static_cast<double>(task.rows) * tokens, MemLevel::l2, !config_.opts.int8_layout,
            Buffer::l1, p_tile);
    ready(core, rings.p_tiles, slot, StageTag::pv, block);
    const double v_tile = static_cast<double>(config_.block_size) * kNopeDim;
    int v_slot = 0;
    if (reread_v_) {
      v_slot = acquire(core, rings.v_tiles, StageTag::pv, block);
      gm_read(core, 0, StageTag::pv, block, label("PV re-read V"),
              static_cast<double>(tokens) * kNopeDim, v_reread_level_, false, Buffer::l1, v_tile);
      ready(core, rings.v_tiles, v_slot, StageTag::pv, block);
      await(core, rings.v_tiles, v_slot, StageTag::pv, block);
    }
    await(core, rings.p_tiles, slot, StageTag::pv, block);
    emit_matmul(core, Matmul{task.rows, kNopeDim, tokens, 1, 1, true, StageTag::pv, block, "PV"});
    release(core, rings.p_tiles, slot, StageTag::pv, block, Buffer::l1, p_tile);
    if (reread_v_) {
      release(core, rings.v_tiles, v_slot, StageTag::pv, block, Buffer::l1, v_tile);
    } else {
      // V is the K tile's nope part: the tile stays in L1 from QK until here.
      release(core, rings.k_tiles, static_cast<int>(block_slot_[block] % rings.k_tiles.slots),
              StageTag::pv, block, Buffer::l1, k_tile_bytes());
    }
    if (flag_at_group_end(item, task.num_blocks)) {
      set_cross(core, 0, Pipe::fix, kFlagUpdateReady, 2, StageTag::pv, block);
    }
  }

  double q_bytes(const MlaTask& task) const {
    return static_cast<double>(task.rows) * (kNopeDim + kRopeDim * kRopeBytes);
  }

  void emit_matmul(int core, const Matmul& mm) {
    StagedRings& rings = cores_[static_cast<std::size_t>(core)];
    ProgramBuilder::emit_matmul(core, mm, rings.l0, rings.l0c,
                                config_.opts.unit_flag ? kUnitFlagPieces : 1);
  }

  // ---- vector ----------------------------------------------------------------------------------
  // AIV0 takes the odd row. A single-row task still runs SM/UP on both AIVs (AIV1 on a
  // padding row) because the mode-2 flags need both AIVs to set.
  int aiv_rows(const MlaTask& task, int aiv) const {
    return aiv == 0 ? (task.rows + 1) / 2 : std::max(1, task.rows / 2);
  }

  void emit_sm(const MlaTask& task, const sched::StageInstance& item, int aiv) {
    const int core = task.core;
    const int unit = aiv + 1;
    StagedRings& rings = cores_[static_cast<std::size_t>(core)];
    Ring& in = rings.s_in[aiv];
    Ring& out = rings.p_out[aiv];
    const int block = item.block;
    const int tokens = block_tokens(task, block);
    const int rows = aiv_rows(task, aiv);
    const bool split = config_.opts.nope_rope_split;
    const bool wait_flags = flag_at_group_start(item);
    const bool partial = tokens < config_.block_size;
    // Elementwise work covers the valid tokens rounded up to a 32-byte vector block (8 fp32).
    const double padded = std::ceil(tokens / 8.0) * 8.0;
    const double reduce_tokens = partial && !config_.opts.tail_reduce ? config_.block_size : padded;
    if (wait_flags) wait_cross(core, unit, Pipe::mte2, kFlagQkReady, StageTag::sm, block);
    const std::uint32_t load_nope = label("SM load S_nope (L2->UB)");
    const std::uint32_t load_rope = label("SM load S_rope (L2->UB)");
    const std::uint32_t dequant = label("SM dequant S_nope");
    const std::uint32_t softmax = label("SM softmax + quantize P");
    const std::uint32_t store = label("SM store P (UB->L2)");
    for (int row0 = 0; row0 < rows; row0 += sm_rows_) {
      const int step_rows = std::min(sm_rows_, rows - row0);
      const double in_tile = static_cast<double>(step_rows) * config_.block_size * 2 * kAccBytes;
      const double s_bytes = static_cast<double>(step_rows) * tokens * kAccBytes;
      const int slot = acquire(core, in, StageTag::sm, block);
      gm_read(core, unit, StageTag::sm, block, load_nope, s_bytes, MemLevel::l2, false, Buffer::ub,
              in_tile);
      ready(core, in, slot, StageTag::sm, block);
      if (split && wait_flags && row0 == 0) {
        wait_cross(core, unit, Pipe::mte2, kFlagQkRopeReady, StageTag::sm, block);
      }
      gm_read(core, unit, StageTag::sm, block, load_rope, s_bytes, MemLevel::l2, false,
              Buffer::none, 0);
      set_event(core, unit, Pipe::mte2, Pipe::v, 2 + slot, StageTag::sm, block);

      const double fp32_tile = step_rows * padded * kAccBytes;
      await(core, in, slot, StageTag::sm, block);
      compute(core, unit, Pipe::v, StageTag::sm, block, dequant,
              vector_cycles(kSmDequantPasses, fp32_tile, kSmDequantInstrs));
      wait_event(core, unit, Pipe::mte2, Pipe::v, 2 + slot, StageTag::sm, block,
                 label("wait S_rope tile ready"));
      const double p_tile = static_cast<double>(step_rows) * config_.block_size;
      const int p_slot = acquire(core, out, StageTag::sm, block);
      double passes = kSmElementwisePasses + kSmReductionPasses * reduce_tokens / padded;
      if (partial && !config_.opts.tail_reduce) passes += kSmMaskPasses * reduce_tokens / padded;
      compute(core, unit, Pipe::v, StageTag::sm, block, softmax,
              vector_cycles(passes, fp32_tile, kSmSoftmaxInstrs), Buffer::ub, p_tile);
      release(core, in, slot, StageTag::sm, block, Buffer::ub, in_tile);
      ready(core, out, p_slot, StageTag::sm, block);
      await(core, out, p_slot, StageTag::sm, block);
      gm_write(core, unit, StageTag::sm, block, store, static_cast<double>(step_rows) * tokens);
      release(core, out, p_slot, StageTag::sm, block, Buffer::ub, p_tile);
    }
    if (flag_at_group_end(item, task.num_blocks)) {
      set_cross(core, unit, Pipe::mte3, kFlagSoftmaxReady, 2, StageTag::sm, block);
    }
  }

  // UP for a run of consecutive blocks of one chunk group: one pass over the running O per
  // tile, adding every block's O_tmp (fewer O loads and stores for larger chunks).
  void emit_up(const MlaTask& task, const std::vector<sched::StageInstance>& run, int aiv) {
    const int core = task.core;
    const int unit = aiv + 1;
    StagedRings& rings = cores_[static_cast<std::size_t>(core)];
    Ring& in = rings.o_tmp[aiv];
    Ring& acc = rings.o_acc[aiv];
    const int rows = aiv_rows(task, aiv);
    const bool first = run.front().block == 0;
    const bool last = run.back().block == task.num_blocks - 1;
    const int tag_block = run.front().block;
    const std::uint32_t load_o = label("UP load O (L2->UB)");
    const std::uint32_t load_tmp = label("UP load O_tmp (L2->UB)");
    const std::uint32_t rescale = label("UP rescale O");
    const std::uint32_t add = label("UP add O_tmp");
    const std::uint32_t final_label = label("UP normalize O");
    const std::uint32_t store_o = label(last ? "UP store O (UB->L2)" : "UP store running O");
    for (int row0 = 0; row0 < rows; row0 += kUpRows) {
      const int tile_rows = std::min(kUpRows, rows - row0);
      const double tile = static_cast<double>(tile_rows) * kNopeDim * kAccBytes;
      const int acc_slot = acquire(core, acc, StageTag::up, tag_block);
      if (first) {
        ready(core, acc, acc_slot, StageTag::up, tag_block, Buffer::ub, tile);
      } else {
        gm_read(core, unit, StageTag::up, tag_block, load_o, tile, MemLevel::l2, false, Buffer::ub,
                tile);
        ready(core, acc, acc_slot, StageTag::up, tag_block);
      }
      std::vector<int> slots;
      for (const sched::StageInstance& item : run) {
        if (row0 == 0 && flag_at_group_start(item)) {
          wait_cross(core, unit, Pipe::mte2, kFlagUpdateReady, StageTag::up, item.block);
        }
        const int slot = acquire(core, in, StageTag::up, item.block);
        gm_read(core, unit, StageTag::up, item.block, load_tmp, tile, MemLevel::l2, false,
                Buffer::ub, tile);
        ready(core, in, slot, StageTag::up, item.block);
        slots.push_back(slot);
      }
      await(core, acc, acc_slot, StageTag::up, tag_block);
      if (!first) {
        compute(core, unit, Pipe::v, StageTag::up, tag_block, rescale,
                vector_cycles(kUpRescalePasses, tile, 1));
      }
      for (std::size_t i = 0; i < run.size(); ++i) {
        await(core, in, slots[i], StageTag::up, run[i].block);
        compute(core, unit, Pipe::v, StageTag::up, run[i].block, add,
                vector_cycles(kUpBlockPasses, tile, kUpBlockInstrs));
        release(core, in, slots[i], StageTag::up, run[i].block, Buffer::ub, tile);
      }
      double out_bytes = tile;
      if (last) {
        compute(core, unit, Pipe::v, StageTag::up, tag_block, final_label,
                vector_cycles(kUpFinalPasses, tile, 2));
        // A split writes its fp32 partial O and its log-sum-exp for the combine pass.
        out_bytes = plan_.splits > 1 ? tile + tile_rows * 4.0
                                     : static_cast<double>(tile_rows) * kNopeDim * kOutBytes;
      }
      // The running O goes back to GM (V -> MTE3 ids 2-3), then the tile is free again.
      set_event(core, unit, Pipe::v, Pipe::mte3, 2 + acc_slot, StageTag::up, tag_block);
      wait_event(core, unit, Pipe::v, Pipe::mte3, 2 + acc_slot, StageTag::up, tag_block,
                 label("wait O tile computed"));
      gm_write(core, unit, StageTag::up, tag_block, store_o, out_bytes);
      release(core, acc, acc_slot, StageTag::up, tag_block, Buffer::ub, tile);
    }
  }

  // ---- tasks -----------------------------------------------------------------------------------
  void emit_task(const MlaTask& task, const sched::Schedule& schedule) {
    const int core = task.core;
    StagedRings& rings = cores_[static_cast<std::size_t>(core)];
    block_slot_.assign(static_cast<std::size_t>(task.num_blocks), 0);
    // q (int8 nope + bf16 rope) stays in L1 for the whole task.
    stage(core, 0, -1, {{kLoadQ, task.rows}}, [&] {
      acquire(core, rings.q_tile, StageTag::setup, -1);
      gm_read(core, 0, StageTag::setup, -1, label("load q (HBM->L1)"), q_bytes(task), MemLevel::hbm,
              false, Buffer::l1, q_bytes(task));
      ready(core, rings.q_tile, 0, StageTag::setup, -1);
    });
    int qks_left = task.num_blocks;
    for (const sched::StageInstance& item : schedule.cube) {
      const int tokens = block_tokens(task, item.block);
      const bool set = flag_at_group_end(item, task.num_blocks);
      if (item.stage == sched::Stage::qk) {
        block_slot_[static_cast<std::size_t>(item.block)] = rings.k_tiles.uses;
        const int ends = (item.block == 0 ? 1 : 0) + (item.block == task.num_blocks - 1 ? 2 : 0);
        stage(core, 0, item.block, {{kQk, tokens, task.rows, ends, set ? 1 : 0}},
              [&] { emit_qk(task, item); });
        --qks_left;
      } else {
        const bool drain = qks_left == 0;
        const int flags = (flag_at_group_start(item) ? 1 : 0) + (set ? 2 : 0) + (drain ? 4 : 0);
        stage(core, 0, item.block, {{kPv, tokens, task.rows, flags}},
              [&] { emit_pv(task, item, drain); });
      }
    }
    for (int aiv = 0; aiv < 2; ++aiv) {
      const int rows = aiv_rows(task, aiv);
      const auto& order = schedule.vector;
      for (std::size_t i = 0; i < order.size();) {
        if (order[i].stage == sched::Stage::sm) {
          const int flags = (flag_at_group_start(order[i]) ? 1 : 0) +
                            (flag_at_group_end(order[i], task.num_blocks) ? 2 : 0);
          stage(core, aiv + 1, order[i].block,
                {{kSm, block_tokens(task, order[i].block), rows, flags}},
                [&] { emit_sm(task, order[i], aiv); });
          ++i;
          continue;
        }
        std::vector<sched::StageInstance> run{order[i]};
        std::size_t j = i + 1;
        while (j < order.size() && order[j].stage == sched::Stage::up &&
               order[j].group == order[i].group) {
          run.push_back(order[j++]);
        }
        // The UP pass's shape: its blocks, whether it starts or ends the task, and which of its
        // blocks wait for UPDATE_READY.
        int waits = 0;
        for (std::size_t k = 0; k < run.size(); ++k) {
          if (flag_at_group_start(run[k])) waits |= 1 << k;
        }
        const int ends =
            (run.front().block == 0 ? 1 : 0) + (run.back().block == task.num_blocks - 1 ? 2 : 0);
        stage(core, aiv + 1, run.front().block,
              {{kUp, static_cast<int>(run.size()), rows, ends, waits}},
              [&] { emit_up(task, run, aiv); });
        i = j;
      }
    }
  }

  void emit_combine() {
    // Every AIV of the launch reaches the mode-0 barrier after its last GM write.
    for (int core = 0; core < config_.cores; ++core) {
      for (int unit = 1; unit <= 2; ++unit) {
        stage(core, unit, -1, {{kBarrier}}, [&] {
          set_cross(core, unit, Pipe::mte3, kFlagCombine, 0, StageTag::sync, -1);
          wait_cross(core, unit, Pipe::mte2, kFlagCombine, StageTag::sync, -1);
        });
      }
    }
    // Rows to merge, cut into UP-sized tiles and dealt out evenly over all AIVs.
    struct Tile {
      int rows;
    };
    std::vector<Tile> tiles;
    for (int sequence = 0; sequence < config_.batch; ++sequence) {
      for (int group = 0; group < plan_.head_groups; ++group) {
        const int heads =
            std::min(plan_.heads_per_group, config_.heads - group * plan_.heads_per_group);
        const int rows = heads * config_.q_len;
        for (int row0 = 0; row0 < rows; row0 += kUpRows)
          tiles.push_back({std::min(kUpRows, rows - row0)});
      }
    }
    const int units = 2 * config_.cores;
    const std::uint32_t load = label("combine load partial O (L2->UB)");
    const std::uint32_t merge = label("combine merge");
    const std::uint32_t store = label("combine store O (UB->L2)");
    for (std::size_t t = 0; t < tiles.size(); ++t) {
      const int target = static_cast<int>(t % static_cast<std::size_t>(units));
      const int core = target / 2;
      const int aiv = target % 2;
      const int unit = aiv + 1;
      StagedRings& rings = cores_[static_cast<std::size_t>(core)];
      stage(core, unit, -1, {{kCombine, tiles[t].rows}}, [&] {
        const double tile = static_cast<double>(tiles[t].rows) * kNopeDim * kAccBytes;
        const int acc_slot = acquire(core, rings.o_acc[aiv], StageTag::combine, -1);
        ready(core, rings.o_acc[aiv], acc_slot, StageTag::combine, -1, Buffer::ub, tile);
        await(core, rings.o_acc[aiv], acc_slot, StageTag::combine, -1);
        for (int split = 0; split < plan_.splits; ++split) {
          const int slot = acquire(core, rings.o_tmp[aiv], StageTag::combine, -1);
          gm_read(core, unit, StageTag::combine, -1, load, tile + tiles[t].rows * 4.0, MemLevel::l2,
                  false, Buffer::ub, tile);
          ready(core, rings.o_tmp[aiv], slot, StageTag::combine, -1);
          await(core, rings.o_tmp[aiv], slot, StageTag::combine, -1);
          compute(core, unit, Pipe::v, StageTag::combine, -1, merge,
                  vector_cycles(kCombineSplitPasses, tile, 2));
          release(core, rings.o_tmp[aiv], slot, StageTag::combine, -1, Buffer::ub, tile);
        }
        compute(core, unit, Pipe::v, StageTag::combine, -1, merge,
                vector_cycles(kCombineFinalPasses, tile, 2));
        set_event(core, unit, Pipe::v, Pipe::mte3, 2 + acc_slot, StageTag::combine, -1);
        wait_event(core, unit, Pipe::v, Pipe::mte3, 2 + acc_slot, StageTag::combine, -1,
                   label("wait O tile computed"));
        gm_write(core, unit, StageTag::combine, -1, store,
                 static_cast<double>(tiles[t].rows) * kNopeDim * kOutBytes);
        release(core, rings.o_acc[aiv], acc_slot, StageTag::combine, -1, Buffer::ub, tile);
      });
    }
  }

  const MlaConfig& config_;
  const MlaPlan& plan_;
  std::vector<StagedRings> cores_;
  std::vector<long long> block_slot_;  // K ring use index of each block of the current task
  int sm_rows_ = kSmRows;
  bool reread_v_ = false;  // cube_reorder: K tiles freed after QK, V re-read for the PV
  MemLevel v_reread_level_ = MemLevel::l2;
};

}  // namespace

const std::vector<MlaOptInfo>& mla_opt_table() {
  static const std::vector<MlaOptInfo> table = {
      {"nope_rope_split",
       "two QK sync stages: flag S_nope ready, then S_rope ready, so the AIV dequantizes early",
       &MlaOptimizations::nope_rope_split},
      {"up_pingpong", "double-buffered UB tiles for O_tmp and the running O in UP",
       &MlaOptimizations::up_pingpong},
      {"sm_head_group", "32 rows per SM step instead of 16 (fewer, larger vector instructions)",
       &MlaOptimizations::sm_head_group},
      {"tail_reduce", "row max / row sum over the valid tokens of a partial last block only",
       &MlaOptimizations::tail_reduce},
      {"unit_flag", "cube/L0C unit flag: FIX drains L0C in pieces while M still runs",
       &MlaOptimizations::unit_flag},
      {"sync_reduce", "one cross-core flag per chunk group instead of one per block",
       &MlaOptimizations::sync_reduce},
      {"int8_layout", "S/P layout for int8: P stored in NZ, no ND->NZ conversion on load",
       &MlaOptimizations::int8_layout},
      {"cube_reorder",
       "chunk >= 2: interleave the next group's QK with this group's PV (no cube bubble)",
       &MlaOptimizations::cube_reorder},
  };
  return table;
}

MlaOptimizations parse_mla_opts(const std::string& list) {
  MlaOptimizations opts;
  std::stringstream stream(list);
  std::string name;
  while (std::getline(stream, name, ',')) {
    if (name.empty() || name == "none") continue;
    if (name == "all") {
      for (const MlaOptInfo& info : mla_opt_table()) opts.*info.field = true;
      continue;
    }
    bool found = false;
    for (const MlaOptInfo& info : mla_opt_table()) {
      if (name == info.name) {
        opts.*info.field = true;
        found = true;
      }
    }
    if (!found) {
      std::string names;
      for (const MlaOptInfo& info : mla_opt_table()) names += std::string(" ") + info.name;
      throw SimError("unknown optimization '" + name + "' (known: all none" + names + ")");
    }
  }
  return opts;
}

std::string mla_opts_to_string(const MlaOptimizations& opts) {
  std::string text;
  for (const MlaOptInfo& info : mla_opt_table()) {
    if (opts.*info.field) text += (text.empty() ? "" : ",") + std::string(info.name);
  }
  return text.empty() ? "none" : text;
}

void validate(const MlaConfig& config, const HwParams& hw) {
  const auto check = [](const char* name, long long value, long long low, long long high) {
    if (value < low || value > high) {
      throw SimError(std::string(name) + " must be in [" + std::to_string(low) + ", " +
                     std::to_string(high) + "] (got " + std::to_string(value) + ")");
    }
  };
  check("batch", config.batch, 1, 4096);
  check("kv", config.kv, 1, 1 << 20);
  check("heads", config.heads, 1, 1024);
  check("q-len", config.q_len, 1, 16);
  check("cores", config.cores, 1, static_cast<long long>(hw.num_cores));
  if (config.block_size != 64 && config.block_size != 128) {
    throw SimError("block-size must be 64 or 128 (got " + std::to_string(config.block_size) + ")");
  }
  if (!schedule::valid_chunk(config.chunk)) {
    throw SimError("chunk must be 1, 2 or 4 (got " + std::to_string(config.chunk) + ")");
  }
  check("min_blocks_per_split", config.min_blocks_per_split, 1, 1 << 20);
  check("max_rows_per_task", config.max_rows_per_task, 1, 128);
  if (hw.cross_core_flag_ids <= kFlagCombine) {
    throw SimError("the MLA kernel needs at least " + std::to_string(kFlagCombine + 1) +
                   " cross-core flag ids");
  }
  if (hw.intra_core_event_ids < 8) {
    throw SimError("the MLA kernel needs 8 intra-core event ids per pipe pair");
  }
}

MlaPlan plan_mla(const MlaConfig& config, const HwParams& hw) {
  validate(config, hw);
  MlaPlan plan;
  plan.heads_per_group =
      std::max(1, std::min(config.heads, config.max_rows_per_task / config.q_len));
  plan.head_groups = (config.heads + plan.heads_per_group - 1) / plan.heads_per_group;
  plan.blocks_per_sequence = (config.kv + config.block_size - 1) / config.block_size;
  plan.splits = static_cast<int>(
      schedule::kv_splits(static_cast<std::int64_t>(config.batch) * plan.head_groups, config.cores,
                          plan.blocks_per_sequence, config.min_blocks_per_split));
  plan.combine = plan.splits > 1;
  for (int sequence = 0; sequence < config.batch; ++sequence) {
    for (int group = 0; group < plan.head_groups; ++group) {
      const int heads = std::min(plan.heads_per_group, config.heads - group * plan.heads_per_group);
      for (int split = 0; split < plan.splits; ++split) {
        const long long nb = plan.blocks_per_sequence;
        MlaTask task;
        task.sequence = sequence;
        task.head_group = group;
        task.split = split;
        const schedule::BlockRange range = schedule::split_blocks(nb, plan.splits, split);
        task.first_block = static_cast<int>(range.begin);
        task.num_blocks = static_cast<int>(range.end - range.begin);
        const int end_token =
            std::min(config.kv, (task.first_block + task.num_blocks) * config.block_size);
        task.tokens = end_token - task.first_block * config.block_size;
        task.rows = heads * config.q_len;
        plan.tasks.push_back(task);
      }
    }
  }
  // Longest task first onto the least loaded core; the cost is the task's tokens times rows
  // plus a fixed pipeline fill of one block, so short tasks are not free.
  std::vector<double> costs;
  for (const MlaTask& task : plan.tasks) {
    costs.push_back((static_cast<double>(task.tokens) + config.block_size) * task.rows);
  }
  std::vector<std::vector<MlaTask>> per_core(static_cast<std::size_t>(config.cores));
  const auto assignment = assign_longest_first(costs, config.cores);
  for (std::size_t core = 0; core < assignment.size(); ++core) {
    for (const std::size_t index : assignment[core]) {
      per_core[core].push_back(plan.tasks[index]);
      per_core[core].back().core = static_cast<int>(core);
    }
  }
  plan.tasks.clear();
  for (const auto& tasks : per_core) {
    if (!tasks.empty()) ++plan.cores_used;
    plan.tasks.insert(plan.tasks.end(), tasks.begin(), tasks.end());
  }
  return plan;
}

Program build_mla_program(const MlaConfig& config, const HwParams& hw, MlaPlan* plan_out) {
  const MlaPlan plan = plan_mla(config, hw);
  MlaBuilder builder(config, hw, plan);
  Program program = builder.build();
  if (plan_out != nullptr) *plan_out = plan;
  return program;
}

std::uint64_t estimate_mla_instructions(const MlaConfig& config, const HwParams& hw) {
  const MlaPlan plan = plan_mla(config, hw);
  // Two one-task builds (one head group of full rows, 4 and 12 blocks, multiples of every chunk)
  // give the instructions per block and per task (the combine pass is left out: ~10 % at most).
  MlaConfig probe = config;
  probe.batch = 1;
  probe.cores = 1;
  probe.heads = plan.heads_per_group;
  const auto probe_size = [&](int blocks) {
    probe.kv = blocks * config.block_size;
    return static_cast<double>(build_mla_program(probe, hw).instrs.size());
  };
  const double few = probe_size(4), many = probe_size(12);
  const double per_block = (many - few) / 8, per_task = few - 4 * per_block;
  double blocks = 0;
  for (const MlaTask& task : plan.tasks) blocks += task.num_blocks;
  return static_cast<std::uint64_t>(per_task * static_cast<double>(plan.tasks.size()) +
                                    per_block * blocks);
}

std::string describe(const MlaConfig& config) {
  return "batch " + std::to_string(config.batch) + ", kv " + std::to_string(config.kv) +
         ", heads " + std::to_string(config.heads) + ", q-len " + std::to_string(config.q_len) +
         ", block " + std::to_string(config.block_size) + ", cores " +
         std::to_string(config.cores) + ", chunk " + std::to_string(config.chunk) + ", opts " +
         mla_opts_to_string(config.opts);
}

}  // namespace ditops::sim
