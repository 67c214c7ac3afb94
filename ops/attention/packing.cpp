#include "ops/attention/packing.hpp"

#include <algorithm>
#include <cstring>

#include "ops/attention/kernels.hpp"
#include "ops/core/scratch.hpp"
#include "ops/core/threads.hpp"

namespace ditops::attention {
namespace {

/// One block of kKvBlock keys of a sequence, for its KV heads [head_begin, head_end) that
/// the call reads: the unit the threads share.
struct PackJob {
  std::int64_t seq, block, head_begin, head_end;
};

/// The packed arrays a call writes: fp32 K^T and V, or their bf16 words (bf16_dot).
struct PackedArrays {
  float *k = nullptr, *v = nullptr;
  std::uint16_t *k_bf16 = nullptr, *v_bf16 = nullptr;
};

/// Packs blocks on one thread: fp32 rows are read in place, bf16 and f16 rows are widened into
/// the packer's own buffers first.
class BlockPacker {
 public:
  using WidenKernel = decltype(AttentionKernels::widen_row);
  using TransposeKernel = decltype(AttentionKernels::transpose_k_panel);

  BlockPacker(const FlashProblem& p, bool bf16_dot, WidenKernel widen, TransposeKernel transpose)
      : p_(p),
        bf16_dot_(bf16_dot),
        widen_(widen),
        transpose_(transpose),
        element_bytes_(dtype_size(p.dtype)),
        dk_padded_(round_up(p.dk, 32)),
        k_block_elements_(k_block_elements(p, bf16_dot)),
        word_slot_(std::max(p.dk, p.dv)),
        widened_(p.dtype == DType::f32 ? 0 : static_cast<std::size_t>(word_slot_)),
        words_(bf16_dot && p.dtype != DType::bf16 ? static_cast<std::size_t>(2 * word_slot_) : 0) {}

  /// One KV head's part of a job: which keys, and where its rows are.
  struct Block {
    std::int64_t seq, head;
    Sequence s;
    std::int64_t first_key, keys;
  };
  Block block(const PackJob& job, std::int64_t head) const {
    const Sequence s = sequence_of(p_, job.seq);
    const std::int64_t first_key = job.block * kKvBlock;
    return {job.seq, head, s, first_key, std::min(kKvBlock, s.kv_len - first_key)};
  }

  /// Where one head's packed K^T and V blocks start, in elements of the packed arrays (fp32, or
  /// bf16 words where bf16_dot); k < 0 for a head the call does not read.
  struct Destination {
    std::int64_t k = -1, v = 0;
  };

  /// Packs a job panel by panel into `packed` (`destination(head)` says where each head's blocks
  /// go), in the order its rows lie in memory. Where the heads of a key lie side by side
  /// ([B, S, N, D], as projections write them) a panel's heads go together, so the reads run
  /// along memory; head by head every row is a fresh page, where the hardware prefetchers stop
  /// (packing's share of a causal FLUX call, S = 2048 on 2 threads, fell from 7.2 to 5.7 % of
  /// the kernel's time).
  template <class Destinations>
  void pack(const PackJob& job, const PackedArrays& packed, const Destinations& destination) {
    const std::int64_t panels = (block(job, job.head_begin).keys + kPanel - 1) / kPanel;
    auto pack_panel = [&](std::int64_t head, std::int64_t panel) {
      const Destination to = destination(head);
      if (to.k < 0) return;
      const Block b = block(job, head);
      if (bf16_dot_) {
        std::uint16_t *k = packed.k_bf16 + to.k, *v = packed.v_bf16 + to.v;
        if (panel == 0) zero_padding(b, k, v);
        k_bf16(b, panel, k);
        v_bf16(b, panel, v);
      } else {
        float *k = packed.k + to.k, *v = packed.v + to.v;
        if (panel == 0) zero_padding(b, k, v);
        k_f32(b, panel, k);
        v_f32(b, panel, v);
      }
    };
    if (p_.k_strides.head < p_.k_strides.seq) {
      for (std::int64_t panel = 0; panel < panels; ++panel) {
        for (std::int64_t head = job.head_begin; head < job.head_end; ++head) {
          pack_panel(head, panel);
        }
      }
    } else {
      for (std::int64_t head = job.head_begin; head < job.head_end; ++head) {
        for (std::int64_t panel = 0; panel < panels; ++panel) pack_panel(head, panel);
      }
    }
  }

  /// Elements of one packed K^T block (bf16 pairs pad dk to 32).
  static std::int64_t k_block_elements(const FlashProblem& p, bool bf16_dot) noexcept {
    return (bf16_dot ? round_up(p.dk, 32) : p.dk) * kKvBlock;
  }

  /// Zeros where no key row lands in a head's K^T and V blocks: past the sequence end, and
  /// past dk (bf16 pairs) and dv (bf16 V; fp32 V's columns are zeroed row by row as they are
  /// copied, and its keys past the end are never read).
  void zero_padding(const Block& b, std::uint16_t* k, std::uint16_t* v) {
    if (b.keys < kKvBlock || p_.dk < dk_padded_) std::fill(k, k + k_block_elements_, 0);
    if (b.keys < kKvBlock || p_.dv < p_.dv_padded) std::fill(v, v + kKvBlock * p_.dv_padded, 0);
  }
  void zero_padding(const Block& b, float* k, float* /*v*/) {
    if (b.keys < kKvBlock) std::fill(k, k + k_block_elements_, 0.f);
  }

  /// Panel `panel` (kPanel keys) of a K^T block as [d / 2][key][2] bf16 words: a pair of d (one
  /// 32-bit word) per store. The rows of the head's next panel are prefetched: in memory every
  /// row may be a fresh page, and the misses overlap.
  void k_bf16(const Block& b, std::int64_t panel, std::uint16_t* kt) {
    const std::int64_t key0 = panel * kPanel, key_end = std::min(b.keys, key0 + kPanel);
    prefetch_rows(p_.k, b, key_end, std::min(b.keys, key_end + kPanel), &BlockPacker::k_row, p_.dk);
    for (std::int64_t key = key0; key < key_end; ++key) {
      const std::uint16_t* row = row_as_bf16(p_.k, k_row(b, key), p_.dk, 0);
      std::uint16_t* column = kt + 2 * key;
      for (std::int64_t d = 0; d + 1 < p_.dk; d += 2) {
        std::memcpy(column + d * kKvBlock, row + d, 2 * sizeof(std::uint16_t));
      }
      if (p_.dk % 2) column[(p_.dk - 1) * kKvBlock] = row[p_.dk - 1];
    }
  }

  /// Panel `panel` of a K^T block in fp32 (kPanel keys x dk, 8 KiB at dk = 128). A full panel
  /// of fp32 rows is transposed in registers (transpose_k_panel); otherwise key by key, each row
  /// read in order while its values scatter into the panel, which stays in L1.
  void k_f32(const Block& b, std::int64_t panel, float* kt) {
    const std::int64_t key0 = panel * kPanel, key_end = std::min(b.keys, key0 + kPanel);
    prefetch_rows(p_.k, b, key_end, std::min(b.keys, key_end + kPanel), &BlockPacker::k_row, p_.dk);
    float* panel_data = kt + packed_k_offset(key0, 0, p_.dk);
    if (p_.dtype == DType::f32 && key_end - key0 == kPanel) {
      const float* rows[kPanel];
      for (std::int64_t key = key0; key < key_end; ++key) {
        rows[key - key0] = static_cast<const float*>(p_.k) + k_row(b, key);
      }
      transpose_(rows, p_.dk, panel_data);
      return;
    }
    for (std::int64_t key = key0; key < key_end; ++key) {
      const float* row = row_as_f32(p_.k, k_row(b, key), p_.dk);
      for (std::int64_t d = 0; d < p_.dk; ++d) panel_data[d * kPanel + key - key0] = row[d];
    }
  }

  /// Keys [panel·kPanel, +kPanel) of a V block as bf16 key pairs interleaved per column
  /// (packed_v_pair_offset); keys past the sequence end and columns past dv are zero (P is 0
  /// there, and 0 x garbage could be NaN). A key pair per pass: its two words of a column in one
  /// 32-bit store.
  void v_bf16(const Block& b, std::int64_t panel, std::uint16_t* vp) {
    const std::int64_t key0 = panel * kPanel, key_end = std::min(b.keys, key0 + kPanel);
    prefetch_rows(p_.v, b, key_end, std::min(b.keys, key_end + kPanel), &BlockPacker::v_row, p_.dv);
    for (std::int64_t key = key0; key < key_end; key += 2) {
      const std::uint16_t* even = row_as_bf16(p_.v, v_row(b, key), p_.dv, 0);
      const std::uint16_t* odd =
          key + 1 < key_end ? row_as_bf16(p_.v, v_row(b, key + 1), p_.dv, 1) : nullptr;
      for (std::int64_t first = 0; first < p_.dv; first += kPanel) {
        auto* dst = reinterpret_cast<std::uint32_t*>(vp + packed_v_pair_offset(key, first));
        const std::int64_t count = std::min(kPanel, p_.dv - first);
        for (std::int64_t i = 0; i < count; ++i) {
          const std::uint32_t high = odd ? odd[first + i] : 0;
          dst[i] = even[first + i] | high << 16;
        }
      }
    }
  }

  /// Keys [panel·kPanel, +kPanel) of a V block in panels of kPanel columns, each [key][kPanel],
  /// filled key by key so each V row is read in order.
  void v_f32(const Block& b, std::int64_t panel, float* vp) {
    const std::int64_t key0 = panel * kPanel, key_end = std::min(b.keys, key0 + kPanel);
    prefetch_rows(p_.v, b, key_end, std::min(b.keys, key_end + kPanel), &BlockPacker::v_row, p_.dv);
    for (std::int64_t key = key0; key < key_end; ++key) {
      const float* row = row_as_f32(p_.v, v_row(b, key), p_.dv);
      for (std::int64_t first = 0; first < p_.dv_padded; first += kPanel) {
        const std::int64_t valid = std::clamp<std::int64_t>(p_.dv - first, 0, kPanel);
        float* dst = vp + packed_v_offset(key, first);
        if (valid == kPanel) {  // a fixed size: copied inline, not a memmove call
          std::memcpy(dst, row + first, kPanel * sizeof(float));
          continue;
        }
        std::copy(row + first, row + first + valid, dst);
        std::fill(dst + valid, dst + kPanel, 0.f);
      }
    }
  }

 private:
  /// The tensor row of the block's key `key` (in p.k_order when set).
  std::int64_t source_key(const Block& b, std::int64_t key) const {
    const std::int64_t position = b.first_key + key;
    return b.s.k_row0 + (p_.k_order ? p_.k_order[position] : position);
  }
  std::int64_t k_row(const Block& b, std::int64_t key) const {
    return b.seq * p_.k_strides.batch + b.head * p_.k_strides.head +
           source_key(b, key) * p_.k_strides.seq;
  }
  std::int64_t v_row(const Block& b, std::int64_t key) const {
    return b.seq * p_.v_strides.batch + b.head * p_.v_strides.head +
           source_key(b, key) * p_.v_strides.seq;
  }
  const float* row_as_f32(const void* base, std::int64_t offset, std::int64_t count) {
    if (p_.dtype == DType::f32) return static_cast<const float*>(base) + offset;
    widen_(p_.dtype, static_cast<const char*>(base) + offset * element_bytes_, count,
           widened_.data());
    return widened_.data();
  }
  /// bf16 words of a row: bf16 rows in place, others widened and rounded into slot 0 or 1 of
  /// words_ (V's key pairs need two rows at once).
  const std::uint16_t* row_as_bf16(const void* base, std::int64_t offset, std::int64_t count,
                                   int slot) {
    if (p_.dtype == DType::bf16) return static_cast<const std::uint16_t*>(base) + offset;
    const float* row = row_as_f32(base, offset, count);
    std::uint16_t* dst = words_.data() + slot * word_slot_;
    for (std::int64_t i = 0; i < count; ++i) dst[i] = bf16::from_float(row[i]).bits;
    return dst;
  }
  /// Prefetches the rows of keys [begin, end) of a block (`row`: k_row or v_row).
  void prefetch_rows(const void* base, const Block& b, std::int64_t begin, std::int64_t end,
                     std::int64_t (BlockPacker::*row)(const Block&, std::int64_t) const,
                     std::int64_t count) const {
    for (std::int64_t key = begin; key < end; ++key) {
      const char* line = static_cast<const char*>(base) + (this->*row)(b, key) * element_bytes_;
      for (std::int64_t byte = 0; byte < count * element_bytes_; byte += 64) {
        __builtin_prefetch(line + byte);
      }
    }
  }

  const FlashProblem& p_;
  const bool bf16_dot_;
  const WidenKernel widen_;
  const TransposeKernel transpose_;
  const std::int64_t element_bytes_, dk_padded_, k_block_elements_, word_slot_;
  core::AlignedBuffer<float> widened_;
  core::AlignedBuffer<std::uint16_t> words_;
};

/// The heads `tasks` read, as a flag per (sequence, KV head) slot.
std::vector<char> heads_used(const FlashProblem& p, const std::vector<FlashTask>& tasks) {
  std::vector<char> used(p.batch * p.kv_heads, 0);
  for (const FlashTask& task : tasks) used[task.seq * p.kv_heads + task.kv_head] = 1;
  return used;
}

}  // namespace

PackedKV PackedKV::pack(const FlashProblem& p, const FlashTiles& tiles,
                        const std::vector<FlashTask>& tasks, int threads) {
  PackedKV packed;
  // V is copied to contiguous fp32 rows once per call for prefill (every row group re-reads
  // it): rows read in place are a [B, S, N, D] stride apart, N·D·4 bytes (12 KiB at N=24,
  // D=128), which maps every row of a KV block to the same L1 sets and thrashes it. Decode-like
  // calls (K read in place) stream V rows once, which costs less than a copy.
  if (tiles.k_layout != KLayout::packed) return packed;
  const AttentionKernels& kernels = attention_kernels();
  const std::int64_t k_block_elements = BlockPacker::k_block_elements(p, tiles.bf16_dot);

  const std::vector<char> used = heads_used(p, tasks);
  const std::int64_t heads_total = p.batch * p.kv_heads;
  packed.k_offset_.resize(heads_total);
  packed.v_offset_.resize(heads_total);
  std::int64_t k_total = 0, v_total = 0;
  core::CheckedSize blocks_total = 0;
  for (std::int64_t seq = 0; seq < p.batch; ++seq) {
    const std::int64_t blocks = blocks_of(sequence_of(p, seq).kv_len);
    bool any_head = false;
    for (std::int64_t head = 0; head < p.kv_heads; ++head) {
      if (!used[seq * p.kv_heads + head]) continue;
      any_head = true;
      packed.k_offset_[seq * p.kv_heads + head] = k_total;
      packed.v_offset_[seq * p.kv_heads + head] = v_total;
      k_total += blocks * k_block_elements;
      v_total += blocks * kKvBlock * p.dv_padded;
    }
    if (any_head) blocks_total = blocks_total + blocks;
  }
  // A job per block and part of the heads: the heads are split only where the blocks alone do
  // not give each thread about four jobs. Sized (and checked) before the list grows: a
  // broadcast K's length sets how many.
  const std::int64_t all_blocks = std::max<std::int64_t>(blocks_total.value, 1);
  const std::int64_t head_parts =
      std::clamp<std::int64_t>((4 * std::int64_t{threads} + all_blocks - 1) / all_blocks, 1,
                               std::max<std::int64_t>(p.kv_heads, 1));
  std::vector<PackJob> jobs;
  core::checked_reserve(jobs, blocks_total * head_parts);
  for (std::int64_t seq = 0; seq < p.batch; ++seq) {
    for (std::int64_t part = 0; part < head_parts; ++part) {
      const std::int64_t head_begin = p.kv_heads * part / head_parts;
      const std::int64_t head_end = p.kv_heads * (part + 1) / head_parts;
      const char* slots = used.data() + seq * p.kv_heads;
      if (std::find(slots + head_begin, slots + head_end, 1) == slots + head_end) continue;
      const std::int64_t blocks = blocks_of(sequence_of(p, seq).kv_len);
      for (std::int64_t block = 0; block < blocks; ++block) {
        jobs.push_back({seq, block, head_begin, head_end});
      }
    }
  }
  if (tiles.bf16_dot) {
    packed.k_bf16_ = core::thread_scratch<std::uint16_t>(core::ScratchUse::attention_k, k_total);
    packed.v_bf16_ = core::thread_scratch<std::uint16_t>(core::ScratchUse::attention_v, v_total);
  } else {
    packed.k_ = core::thread_scratch<float>(core::ScratchUse::attention_k, k_total);
    packed.v_ = core::thread_scratch<float>(core::ScratchUse::attention_v, v_total);
  }
  const PackedArrays arrays{packed.k_, packed.v_, packed.k_bf16_, packed.v_bf16_};
  core::parallel_ranges(static_cast<std::int64_t>(jobs.size()), threads,
                        [&](std::int64_t begin, std::int64_t end, int) {
                          BlockPacker packer(p, tiles.bf16_dot, kernels.widen_row,
                                             kernels.transpose_k_panel);
                          for (std::int64_t j = begin; j < end; ++j) {
                            const PackJob& job = jobs[j];
                            packer.pack(job, arrays, [&](std::int64_t head) {
                              const std::int64_t slot = job.seq * p.kv_heads + head;
                              if (!used[slot]) return BlockPacker::Destination{};
                              return BlockPacker::Destination{
                                  packed.k_offset_[slot] + job.block * k_block_elements,
                                  packed.v_offset_[slot] + job.block * kKvBlock * p.dv_padded};
                            });
                          }
                        });
  return packed;
}

}  // namespace ditops::attention
