#pragma once
// The streaming writers of kernel sources: LineStager and ShiftedStreamWriter stream rows
// whose ends share cache lines (or vectors) with their neighbours.

#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "ops/core/simd/convert.hpp"
#include "ops/core/simd/gaps.hpp"

namespace ditops::simd {

// ---- streaming rows that share cache lines -------------------------------------------------

/// Rows of at most this many bytes are staged by LineStager; in longer ones the two partial lines
/// at the ends are a small share of the row's lines.
inline constexpr std::size_t kMaxStagedRowBytes = 4096;

/// Streams the outputs of rows that share cache lines with their neighbours. A row that does
/// not start on a line, or does not fill whole lines (a row of 128 f32 16 bytes past a line, as
/// malloc and numpy place large arrays), begins and ends in lines that neighbouring rows write
/// too; streaming its whole lines and writing those partial lines with ordinary stores mixes the
/// two kinds of store on neighbouring lines and loses the write-combining (measured: RoPE f32
/// over such rows at half the speed of line-aligned ones). Such a row is computed instead into a
/// line-aligned staging buffer, at the same offset within a line as its destination, with
/// ordinary stores (L1); then every line of it that is complete is streamed to its destination,
/// and its last, incomplete line stays in the buffer for the next row, which completes it when
/// it continues in memory (else it is written with ordinary stores). The first line of a
/// thread's range and the last one are written with ordinary stores.
///
/// Rows that start on a line and fill whole lines are written in place (begin_row returns dst),
/// as are rows longer than kMaxStagedRowBytes and every row when not streaming: the caller
/// streams those itself when streams_in_place() says so. The values a row computes do not
/// depend on where they are written, so staged and direct rows are bit for bit the same.
template <class Arch, class T>
class LineStager {
 public:
  LineStager(std::size_t dim, bool stream) noexcept
      : row_bytes_(dim * sizeof(T)), stream_(stream) {}
  LineStager(const LineStager&) = delete;
  LineStager& operator=(const LineStager&) = delete;
  ~LineStager() { finish(); }

  /// Where to compute the row that will be stored at `dst` (dst itself, or the staging buffer).
  T* begin_row(T* dst) noexcept {
    const auto address = reinterpret_cast<std::uintptr_t>(dst);
    const std::size_t phase = address % kCacheLineBytes;
    staged_ = stream_ && row_bytes_ <= kMaxStagedRowBytes && address % alignof(T) == 0 &&
              (phase != 0 || row_bytes_ % kCacheLineBytes != 0);
    if (!staged_) {
      flush();
      return dst;
    }
    // The pending bytes are the start of this row's first line when the row continues them.
    if (pending_ && pending_line_ + pending_to_ != address) flush();
    valid_from_ = pending_ ? pending_from_ : phase;
    valid_to_ = phase + row_bytes_;
    pending_ = false;
    line_ = address - phase;
    return reinterpret_cast<T*>(buffer_ + phase);
  }

  /// Whether the caller streams the current row itself (a row written in place while streaming).
  bool streams_in_place() const noexcept { return stream_ && !staged_; }

  /// Streams the complete lines of a staged row and keeps its incomplete last line pending.
  void end_row() noexcept {
    if (!staged_) return;
    const std::size_t whole_end = valid_to_ / kCacheLineBytes * kCacheLineBytes;
    auto* target = reinterpret_cast<std::byte*>(line_);
    for (std::size_t at = 0; at < whole_end; at += kCacheLineBytes) {
      if (at >= valid_from_) {
        move_line<true>(target + at, buffer_ + at);
      } else {  // the row's first line, begun by bytes this stager does not hold
        std::memcpy(target + valid_from_, buffer_ + valid_from_, kCacheLineBytes - valid_from_);
      }
    }
    if (whole_end < valid_to_) {
      pending_from_ = std::max(valid_from_, whole_end) - whole_end;
      pending_to_ = valid_to_ - whole_end;
      pending_line_ = line_ + whole_end;
      move_line<false>(buffer_, buffer_ + whole_end);  // a whole line: no call, no byte count
      pending_ = true;
    }
  }

  /// Writes the pending bytes, if any (ordinary stores). Call before stream_fence.
  void finish() noexcept { flush(); }

 private:
  void flush() noexcept {
    if (!pending_) return;
    std::memcpy(reinterpret_cast<std::byte*>(pending_line_) + pending_from_,
                buffer_ + pending_from_, pending_to_ - pending_from_);
    pending_ = false;
  }

  /// Copies one line-aligned line (its bits, as floats), streamed to memory or not.
  template <bool kStream>
  static void move_line(std::byte* dst, const std::byte* src) noexcept {
    constexpr std::size_t kVectorBytes = F32<Arch>::size * sizeof(float);
    for (std::size_t at = 0; at < kCacheLineBytes; at += kVectorBytes) {
      const auto v = F32<Arch>::load_aligned(reinterpret_cast<const float*>(src + at));
      if constexpr (kStream) {
        store_stream<Arch>(reinterpret_cast<float*>(dst + at), v);
      } else {
        v.store_aligned(reinterpret_cast<float*>(dst + at));
      }
    }
  }

  std::size_t row_bytes_;
  bool stream_;
  bool staged_ = false;
  std::uintptr_t line_ = 0;  ///< the line of the current row's first byte
  /// The current row's bytes in the buffer (from valid_from_ when earlier bytes are pending).
  std::size_t valid_from_ = 0, valid_to_ = 0;
  bool pending_ = false;  ///< buffer_[pending_from_, pending_to_) awaits pending_line_
  std::size_t pending_from_ = 0, pending_to_ = 0;
  std::uintptr_t pending_line_ = 0;
  alignas(kCacheLineBytes) std::byte buffer_[kMaxStagedRowBytes + 2 * kCacheLineBytes];
};

/// Streams a run of output written as whole vectors in memory order (AVX2 and AVX-512) when it
/// starts part way into a vector's alignment: each vector is joined with the one before it by
/// one permute (two on AVX2) into the aligned vector that spans their seam, and that is
/// streamed, so no byte goes through memory twice. A row that starts where the previous one
/// ended continues the run: a thread's range of contiguous rows (RoPE's BSND rows of 128 f32 16
/// bytes past a line, as malloc and numpy place them) has only two partial vectors, at its ends,
/// written with ordinary masked stores. Line-aligned runs stream each vector as it comes. A run
/// must start on a 4-byte boundary (joins move whole 32-bit lanes; starts() tells).
template <class Arch>
inline constexpr bool kHasShiftedStreams = kIsAvx512<Arch> || kIsAvx2<Arch>;

/// The integer register of a vector width (not std::conditional_t: GCC drops the vector types'
/// attributes from template arguments).
template <bool kAvx512>
struct IntRegister {
  using type = __m256i;
};
template <>
struct IntRegister<true> {
  using type = __m512i;
};

template <class Arch>
class ShiftedStreamWriter {
 public:
  static_assert(kHasShiftedStreams<Arch>);
  using Bits = typename IntRegister<kIsAvx512<Arch>>::type;
  static constexpr std::size_t kVectorBytes = sizeof(Bits);
  static constexpr int kLanes = static_cast<int>(kVectorBytes / 4);

  ShiftedStreamWriter() = default;
  ShiftedStreamWriter(const ShiftedStreamWriter&) = delete;
  ShiftedStreamWriter& operator=(const ShiftedStreamWriter&) = delete;
  ~ShiftedStreamWriter() { finish(); }

  /// Whether a run can start at dst.
  static bool starts(const void* dst) noexcept {
    return reinterpret_cast<std::uintptr_t>(dst) % 4 == 0;
  }

  /// The next vectors go to dst (starts(dst)); a dst that does not continue the run ends it.
  void begin_row(void* dst) noexcept {
    const auto address = reinterpret_cast<std::uintptr_t>(dst);
    if (address == next_) return;
    finish();
    shift_ = static_cast<int>(address % kVectorBytes / 4);
    next_ = address;
    started_ = false;
    if constexpr (kIsAvx512<Arch>) {
      // Lane i of a join takes lane kLanes - shift + i of the two vectors (previous, current).
      join_index_ =
          _mm512_add_epi32(_mm512_set1_epi32(kLanes - shift_),
                           _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    } else {
      // Both vectors rotated up by shift lanes; the lanes below shift come from the previous.
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      rotate_index_ = _mm256_and_si256(_mm256_add_epi32(lane, _mm256_set1_epi32(kLanes - shift_)),
                                       _mm256_set1_epi32(kLanes - 1));
      from_previous_ = _mm256_cmpgt_epi32(_mm256_set1_epi32(shift_), lane);
    }
  }

  /// Writes the next kVectorBytes of the run.
  void push(Bits v) noexcept {
    const Bits joined = join(v);
    Bits* target = aligned_target();
    if (started_ || shift_ == 0) {
      stream(target, joined);
    } else {  // the run's first vector: its lanes from shift_ on
      store_lanes(target, joined, shift_, kLanes);
    }
    started_ = true;
    next_ += kVectorBytes;
  }

  /// Writes lo and hi (2 * F32<Arch>::size floats) as T.
  template <class T, bool kMayBeNaN = true>
  void push_pair(F32<Arch> lo, F32<Arch> hi) noexcept {
    if constexpr (std::is_same_v<T, float>) {
      push(bits(lo));
      push(bits(hi));
    } else {
      push(simd::pack_16bit_pair<Arch, T, kMayBeNaN>(lo, hi));
    }
  }

  /// Writes the run's last partial vector, if any. Call before stream_fence.
  void finish() noexcept {
    if (started_ && shift_ != 0) {
      store_lanes(aligned_target(), tail(), 0, shift_);
    }
    started_ = false;
    next_ = 0;
  }

 private:
  /// Where the next joined vector goes: the aligned vector holding next_ (shift_ lanes in).
  Bits* aligned_target() const noexcept {
    return reinterpret_cast<Bits*>(next_ - static_cast<std::uintptr_t>(shift_) * 4);
  }

  static Bits bits(F32<Arch> v) noexcept {
    if constexpr (kIsAvx512<Arch>) {
      return _mm512_castps_si512(v);
    } else {
      return _mm256_castps_si256(v);
    }
  }

  /// Lanes [0, shift) from the previous vector's last lanes, the rest from v's first ones.
  Bits join(Bits v) noexcept {
    if constexpr (kIsAvx512<Arch>) {
      const Bits joined = _mm512_permutex2var_epi32(previous_, join_index_, v);
      previous_ = v;
      return joined;
    } else {
      const Bits rotated = _mm256_permutevar8x32_epi32(v, rotate_index_);
      const Bits joined = _mm256_blendv_epi8(rotated, previous_, from_previous_);
      previous_ = rotated;
      return joined;
    }
  }
  /// The previous vector's last shift_ lanes in lanes [0, shift_).
  Bits tail() const noexcept {
    if constexpr (kIsAvx512<Arch>) {
      return _mm512_permutex2var_epi32(previous_, join_index_, previous_);
    } else {
      return previous_;  // rotated: its last lanes are already first
    }
  }

  static void stream(Bits* target, Bits v) noexcept {
    if constexpr (kIsAvx512<Arch>) {
      _mm512_stream_si512(target, v);
    } else {
      _mm256_stream_si256(target, v);
    }
  }
  /// Ordinary stores of lanes [from, to) of v.
  static void store_lanes(Bits* target, Bits v, int from, int to) noexcept {
    if constexpr (kIsAvx512<Arch>) {
      const auto mask = static_cast<__mmask16>(((1u << to) - 1) & ~((1u << from) - 1));
      _mm512_mask_storeu_epi32(target, mask, v);
    } else {
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      const __m256i mask = _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(from), lane),
                                               _mm256_cmpgt_epi32(_mm256_set1_epi32(to), lane));
      _mm256_maskstore_epi32(reinterpret_cast<int*>(target), mask, v);
    }
  }

  int shift_ = 0;            ///< the run's offset within a vector, in 32-bit lanes
  std::uintptr_t next_ = 0;  ///< where the run continues (0: no run)
  bool started_ = false;     ///< a vector of the run was pushed
  Bits previous_{};          ///< (AVX2: rotated by shift_)
  Bits join_index_{}, rotate_index_{}, from_previous_{};
};

}  // namespace ditops::simd
