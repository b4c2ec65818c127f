// The K/V tile ring that attention_simt and attention_mma stream keys through (cp.async,
// kStages deep; attention_wgmma has its own producer warpgroup).
//
// Tile i holds keys begin + i * kTile + [0, kTile) in stage i % kStages. Its row offsets are
// resolved once per key, by thread j for key j, into offset slot i % kOffsetSlots, and shared
// through shared memory with the threads that issue the 16-byte copies. Kernels use it as:
//
//   ring.start(kv, window); barrier; ring.issue(s) for s < kStages - 1
//   for each tile i:
//     cp_async_wait<kStages - 2>(); barrier   // tile i has landed
//     ring.issue(i + kStages - 1)             // refills tile i-1's stage
//     compute tile i (ring.k_tile(i), ring.v_tile(i), ring.mapped(i) for masks)
//     ring.advance(kv, i, window)             // stores tile i+kStages's offsets, looks up
//                                             // tile i+kStages+kAhead
//
// The block_table loads run kAhead tiles ahead of their use (`window` is per thread), so in
// decode, where a tile's compute is short, the table's DRAM latency is not paid once per tile.
//
// kOffsetSlots >= kStages + 1, so the slot that advance(i) writes held a tile no newer than
// i - 1, whose last reader (compute of tile i - 1) finished before tile i's barrier; the next
// reader (issue at i + 1) comes after the next barrier, so one barrier per tile suffices. Rows
// that are unmapped or past `end` have offset -1: their copies zero-fill (src-size 0), so pool
// garbage never reaches shared memory.
#pragma once

#include <cstdint>

#include "cuda/device_utils.cuh"
#include "cuda/kv_source.cuh"

namespace pagekernels::cuda {

// How a tile's rows sit in shared memory.
enum class TileLayout {
  kPlain,       // [kTile][kRowElems]
  kSwizzleRow,  // same, 16-byte chunk c of row r at chunk c ^ (r % 8) (conflict-free ldmatrix)
};

// kRowElems: elements per shared row (the kernel's head-dim capacity).
template <typename T, int kTile, int kRowElems, int kStages, int kThreads, TileLayout kLayout>
struct KVRing {
  // At least kStages + 1 (see above); a power of two, so tile % kOffsetSlots is a mask.
  static constexpr int kOffsetSlots = kStages < 4 ? 4 : 8;
  static_assert(kStages + 1 <= kOffsetSlots, "offset slots for every live tile");
  static constexpr int kElemsPerChunk = 16 / int(sizeof(T));
  static constexpr int kChunks = kRowElems / kElemsPerChunk;  // 16-byte chunks per row
  static constexpr int kTileElems = kTile * kRowElems;
  // Copies: thread t always moves chunk t % kChunks, of rows t / kChunks + p * kCopyRows.
  static_assert(kThreads % kChunks == 0 && kTile % (kThreads / kChunks) == 0,
                "tile copies must split evenly, one chunk column per thread");
  static constexpr int kCopyRows = kThreads / kChunks;  // rows per copy pass
  static constexpr int kCopyPasses = kTile / kCopyRows;
  static_assert(kLayout == TileLayout::kPlain || kCopyRows % 8 == 0,
                "swizzled rows repeat every 8: a pass must keep the pattern");
  static_assert(kTile <= kThreads, "one thread per key resolves offsets");
  static constexpr size_t kRingBytes = 2 * size_t{kStages} * kTileElems * sizeof(T);
  static constexpr size_t kSmemBytes = kRingBytes + kOffsetSlots * kTile * sizeof(int64_t);

  T* k_ring;         // [kStages][kTile][kRowElems]
  T* v_ring;         // same
  int64_t* offsets;  // [kOffsetSlots][kTile]
  const T* k;
  const T* v;
  int b;
  int kv_head;
  int begin;      // first key of tile 0
  int end;        // keys >= end are never loaded
  int head_dim;   // valid elements per row (<= kRowElems)
  int num_tiles;

  __device__ __forceinline__ KVRing(unsigned char* smem, const T* k_, const T* v_, int b_,
                                    int kv_head_, int begin_, int end_, int head_dim_)
      : k_ring(reinterpret_cast<T*>(smem)),
        v_ring(k_ring + kStages * kTileElems),
        offsets(reinterpret_cast<int64_t*>(v_ring + kStages * kTileElems)),
        k(k_),
        v(v_),
        b(b_),
        kv_head(kv_head_),
        begin(begin_),
        end(end_),
        head_dim(head_dim_),
        num_tiles(tile_count<kTile>(begin_, end_)) {}

  __device__ __forceinline__ static int position(int row, int chunk) {
    if constexpr (kLayout == TileLayout::kSwizzleRow) {
      return row * kRowElems + ((chunk ^ (row & 7)) * kElemsPerChunk);
    } else {
      return row * kRowElems + chunk * kElemsPerChunk;
    }
  }

  // Starts the block_table lookup of this thread's key in `tile` (no-op rows get page -1).
  template <typename KV>
  __device__ __forceinline__ KVRow locate(const KV& kv, int tile) const {
    const int j = static_cast<int>(threadIdx.x);
    const int t = begin + tile * kTile + j;
    return (j < kTile && tile < num_tiles && t < end) ? kv.locate(b, t) : KVRow{-1, 0};
  }

  // Publishes this thread's key offset of `tile`; true when the key is in range but unmapped.
  template <typename KV>
  __device__ __forceinline__ bool store_offsets(const KV& kv, int tile, KVRow row) const {
    const int j = static_cast<int>(threadIdx.x);
    if (j >= kTile || tile >= num_tiles) return false;
    const int64_t off = kv.offset(row, kv_head);
    offsets[(tile % kOffsetSlots) * kTile + j] = off;
    return off < 0 && begin + tile * kTile + j < end;
  }

  // Copies of `tile` into its stage as one cp.async group (an empty group past the last tile,
  // so the wait counts stay uniform). Per copy: one offset load, one add, two cp.async.
  __device__ __forceinline__ void issue(int tile) const {
    if (tile < num_tiles) {
      const int row = static_cast<int>(threadIdx.x) / kChunks;
      const int chunk = static_cast<int>(threadIdx.x) % kChunks;
      const int64_t* offs = tile_offsets(tile) + row;
      const int stage = (tile % kStages) * kTileElems + position(row, chunk);
      const int elem = chunk * kElemsPerChunk;  // past head_dim: zero-filled
      // Not unrolled: the 128-row mma.sync prefill tile has no registers to spare.
#pragma unroll 1
      for (int pass = 0; pass < kCopyPasses; ++pass) {
        const int64_t off = offs[pass * kCopyRows];
        const bool valid = off >= 0 && elem < head_dim;
        const int64_t src = valid ? off + elem : 0;
        const int dst = stage + pass * kCopyRows * kRowElems;
        cp_async_16(k_ring + dst, k + src, valid);
        cp_async_16(v_ring + dst, v + src, valid);
      }
    }
    cp_async_commit();
  }

  // Prologue: offsets of tiles 0 .. kStages-1 (their lookups in flight together) and the first
  // lookups of the window. Bit s of the result: this thread's key of tile s is unmapped.
  template <typename KV, int kAhead>
  __device__ __forceinline__ uint32_t start(const KV& kv, KVRow (&window)[kAhead]) const {
    KVRow first[kStages];
#pragma unroll
    for (int s = 0; s < kStages; ++s) first[s] = locate(kv, s);
#pragma unroll
    for (int a = 0; a < kAhead; ++a) window[a] = locate(kv, kStages + a);
    uint32_t unmapped = 0;
#pragma unroll
    for (int s = 0; s < kStages; ++s) unmapped |= uint32_t{store_offsets(kv, s, first[s])} << s;
    return unmapped;
  }

  // End of iteration i: publishes tile i+kStages from the window, then looks up the tile
  // kAhead further. True when this thread's key of tile i+kStages is unmapped.
  template <typename KV, int kAhead>
  __device__ __forceinline__ bool advance(const KV& kv, int i, KVRow (&window)[kAhead]) const {
    const bool unmapped = store_offsets(kv, i + kStages, window[0]);
#pragma unroll
    for (int a = 0; a + 1 < kAhead; ++a) window[a] = window[a + 1];
    window[kAhead - 1] = locate(kv, i + kStages + kAhead);
    return unmapped;
  }

  __device__ __forceinline__ const T* k_tile(int tile) const {
    return k_ring + (tile % kStages) * kTileElems;
  }
  __device__ __forceinline__ const T* v_tile(int tile) const {
    return v_ring + (tile % kStages) * kTileElems;
  }
  __device__ __forceinline__ const int64_t* tile_offsets(int tile) const {
    return offsets + (tile % kOffsetSlots) * kTile;
  }
  // Whether key j of `tile` (counted from its first key) has a page, for mask_scores.
  __device__ __forceinline__ auto mapped(int tile) const {
    const int64_t* offs = tile_offsets(tile);
    return [offs](int j) { return offs[j] >= 0; };
  }
  __device__ __forceinline__ int first_key(int tile) const { return begin + tile * kTile; }
};

// Which offset slots hold a tile with an unmapped key in range (only those need the element
// mask), agreed on by the whole CTA through the ring's barriers (__syncthreads_or).
template <int kStages, int kSlots>
class UnmappedTiles {
 public:
  // The prologue barriers; `mine` is this thread's KVRing::start result.
  __device__ __forceinline__ void start(uint32_t mine) {
    for (int s = 0; s < kStages; ++s) {
      if (__syncthreads_or((mine >> s) & 1u)) bits_ |= 1u << s;
    }
  }

  // The barrier before tile i; it also collects the flags of tile i + kStages - 1, whose offsets
  // KVRing::advance stored at the end of iteration i - 1 (`stored` is its result).
  __device__ __forceinline__ void barrier(int i, bool stored) {
    const uint32_t bit = 1u << ((i + kStages - 1) % kSlots);
    if (__syncthreads_or(stored)) {
      bits_ |= bit;
    } else if (i > 0) {
      bits_ &= ~bit;
    }
  }

  __device__ __forceinline__ bool operator()(int tile) const {
    return (bits_ >> (tile % kSlots)) & 1u;
  }

 private:
  uint32_t bits_ = 0;
};

}  // namespace pagekernels::cuda
