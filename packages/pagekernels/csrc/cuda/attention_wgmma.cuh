// Hopper prefill kernel, warp-specialised and persistent (wgmma, sm_90a), for float16 and
// bfloat16 at D = 128: the prefill schedule's 128-row tiles (L * G > 64 packed rows).
//
// One CTA per SM walks a sequence of work items (PersistentSchedule: longest first, snake order
// across CTAs), so one item's prologue and epilogue overlap the next item's loads instead of
// leaving the tensor cores idle between CTAs.
//
// CTA = 3 warpgroups. Warpgroups 0 and 1 (consumers) own 64 packed query rows each; warpgroup 2
// (producer) resolves each item's rows, loads its Q tile and streams its 128-key K/V tiles into
// a ring of kStages stages (TMA for runs of consecutive rows, cp.async for the rest), doing
// every block-table lookup and address calculation. Buffers change hands through mbarriers:
//   full[s]   completes when the tile's copies have landed (each producer thread arrives once
//             its cp.async copies complete, and each producer warp's lane 0 after storing the
//             stage's unmapped-key word, adding the bytes its TMA copies deliver);
//   empty[s]  completes when both consumer warpgroups are done with the tile (one arrival per
//             consumer warp, after its P V has read the values, or at once from a warpgroup
//             whose rows end before the tile);
//   q_full    completes when an item's Q tile has landed and its CtaRows are in shared memory
//             (two slots, by item parity, so the consumers' epilogue can still read the last);
//   q_empty   completes when every consumer warp has waited for its last Q K^T of the item.
// No CTA-wide barrier runs inside the loops, so the two consumers drift apart. Each consumer
// runs a tile in order (cuDNN's): issue S = Q K^T (Q read from shared memory, which leaves the
// registers to S, O and P), wait, mask, softmax, rescale O, issue O += P V, wait. Named
// barriers pass a turn between the two around the softmax (a ping-pong), so one warpgroup's
// exponentials run while the other's MMAs do. After a row's first tile the softmax rarely
// computes a max (softmax_scores_lazy_max), and P is packed to 16 bits inside its run of
// exponentials, where the conversions fill the MUFU's issue interval.
// Outputs go from the accumulators straight to global memory (the ring is busy with the next
// item). The producer gives registers back (setmaxnreg) so the consumers can hold S, O and P.
#pragma once

#include "cuda/attention_common.cuh"
#include "cuda/kv_source.cuh"
#include "cuda/mma_tile.cuh"
#include "cuda/warp_specialization.cuh"
#include "cuda/wgmma.cuh"

namespace pagekernels::cuda {

template <typename T, int kStagesArg>
struct WgmmaConfig {
  static constexpr int kHeadDim = 128;
  static constexpr int kConsumerThreads = 256;  // warpgroups 0 and 1
  static constexpr int kProducerThreads = 128;  // warpgroup 2
  static constexpr int kThreads = kConsumerThreads + kProducerThreads;
  static constexpr int kGroupRows = 64;  // the m of wgmma
  static constexpr int kRows = 2 * kGroupRows;
  static constexpr int kTile = 128;  // keys per stage: the n of Q K^T
  static constexpr int kStages = kStagesArg;
  // One warpgroup may still run P V on tile j - 1 while the other starts S on tile j.
  static_assert(kStages >= 3, "tiles j - 1 and j in use while j + 1 loads");
  // setmaxnreg budgets: 128 x 40 + 256 x 232 = 64,512, what the CTA is launched with (168 per
  // thread at 384 threads). More would make setmaxnreg.inc wait forever.
  static constexpr int kProducerRegs = 40;
  static constexpr int kConsumerRegs = 232;
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static_assert(kProducerThreads * kProducerRegs + kConsumerThreads * kConsumerRegs <=
                    kThreads * kLaunchRegs,
                "the consumers' registers must come from the producer's");
  static_assert(kRows == kProducerThreads, "each producer thread resolves one row of Q");
  static_assert(kProducerRegs % 8 == 0 && kConsumerRegs % 8 == 0 && kProducerRegs >= 24 &&
                    kConsumerRegs <= 256,
                "setmaxnreg takes multiples of 8 in [24, 256]");
  static constexpr int kTileElems = kTile * kHeadDim;
  static constexpr uint32_t kTileBytes = kTileElems * sizeof(T);
  static constexpr int kDimSteps = kHeadDim / 16;  // k16 steps of Q K^T
  static constexpr int kKeySteps = kTile / 16;     // k16 steps of P V
  static constexpr int kScoreBlocks = kTile / 8;
  static constexpr int kOutBlocks = kHeadDim / 8;
  static constexpr int kMaskWords = kTile / 32;  // unmapped-key bits of a stage, one per key

  // Shared memory: K stages, V stages, the Q tile, per-stage mask words, two work-item slots,
  // the mbarriers (full[kStages], empty[kStages], q_full, q_empty).
  static constexpr size_t kKOffset = 0;
  static constexpr size_t kVOffset = kKOffset + size_t{kStages} * kTileBytes;
  static constexpr size_t kQOffset = kVOffset + size_t{kStages} * kTileBytes;
  static constexpr size_t kMaskOffset = kQOffset + size_t{kRows} * kHeadDim * sizeof(T);
  static constexpr size_t kItemOffset = kMaskOffset + size_t{kStages} * kMaskWords * 4;
  static constexpr size_t kBarrierOffset = kItemOffset + 2 * sizeof(CtaRows);
  static constexpr size_t kLayoutBytes = kBarrierOffset + (2 * size_t{kStages} + 2) * 8;
  // Slack to start the tiles on a 1024-byte boundary, which the swizzle pattern needs.
  static constexpr size_t kSmemBytes = kLayoutBytes + kSwizzleAtomBytes;
  static_assert(kItemOffset % alignof(CtaRows) == 0 && kBarrierOffset % 8 == 0,
                "work items and mbarriers are aligned");

  // Named barrier ids: consumers only (Q with a folded scale), and one per consumer for the
  // ping-pong.
  static constexpr int kConsumerBarrier = 1;
  static constexpr int kTurnBarrier0 = 2;
};

// How the producer's warps copy rows into 128-byte-swizzled [kRows][kHeadDim] tiles: warp w
// copies rows 32 w .. 32 w + 31 but those set in `skip` (bit k: row 32 w + k), lane l having
// resolved row 32 w + l to the element `offset` of its source (< 0: zero-fill) and passing it on
// by shuffle; lanes take 32-byte pairs of 16-byte chunks, 8 lanes per 256-byte row.
// copy(dst, src, valid) issues one chunk (dst and src are element offsets).
template <int kRows, int kHeadDim, typename T, typename Copy>
__device__ __forceinline__ void copy_warp_rows(int64_t offset, int warp, int lane, uint32_t skip,
                                               Copy copy) {
  // The shared-memory positions below depend only on the lane; the compiler hoisted them out
  // of the producer's item loop and ptxas spilled them, and each pass of every item's Q copy
  // then stalled on their reloads (ncu, session 12).
  lane = opaque(lane);
  constexpr int kLanesPerRow = kHeadDim * sizeof(T) / 32;  // one 32-byte pair each
  constexpr int kRowsPerPass = 32 / kLanesPerRow;
  const int chunk = 2 * (lane % kLanesPerRow);
#pragma unroll
  for (int pass = 0; pass < 32 / kRowsPerPass; ++pass) {
    const int row = kRowsPerPass * pass + lane / kLanesPerRow;  // within this warp's 32 rows
    const int64_t off = __shfl_sync(0xffffffffu, offset, row);
    if ((skip >> row) & 1u) continue;
    const bool valid = off >= 0;
    const int64_t src = valid ? off + chunk * 8 : 0;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      copy(swizzle128_position<kRows>(32 * warp + row, chunk + c), src + c * 8, valid);
    }
  }
}

// The producer warpgroup's side of one stage: thread `key` resolves that key of the tile and
// stores its warp's unmapped-key word. Runs of p.tma.box_rows keys whose rows are present and
// consecutive in storage (a page, or part of one) are bulk-copied by TMA, one copy per 64
// columns of K and of V, issued by the run's first lane; the other rows (unmapped, past the
// chunk, a run cut short by the context's end) go by cp.async with zero fill (copy_warp_rows).
template <typename T, typename C, typename KV>
struct KVTileProducer {
  const AttentionParams<T, KV>& p;
  T* k_ring;
  T* v_ring;
  uint32_t* mask_words;  // [kStages][kMaskWords]
  int b;
  int kv_head;
  int begin;
  int end;
  int key;  // this thread's key within a tile

  // Issues the block-table load of this thread's key of `tile` (checked against `end` only in
  // issue(), so the load can start before the item's key count is known).
  __device__ __forceinline__ KVRow locate(int tile) const {
    return p.kv.locate(b, begin + tile * C::kTile + key);
  }

  // The lanes of this warp whose rows TMA copies: the box-aligned runs of box_rows lanes whose
  // rows are all present and consecutive in storage.
  __device__ __forceinline__ uint32_t bulk_lanes(int64_t offset, int lane) const {
    const int box = p.tma.box_rows;
    if (box == 0) return 0;
    const int first_lane = lane & ~(box - 1);
    const int64_t first = __shfl_sync(0xffffffffu, offset, first_lane);
    const bool in_run =
        offset >= 0 && offset == first + static_cast<int64_t>(lane - first_lane) * C::kHeadDim;
    const uint32_t in_runs = __ballot_sync(0xffffffffu, in_run);
    const uint32_t run = (box == 32 ? 0xffffffffu : (1u << box) - 1u) << first_lane;
    return __ballot_sync(0xffffffffu, (in_runs & run) == run);
  }

  // Copies `tile` (this thread's key looked up in `row`) into `stage`, stores the stage's mask
  // word of this warp (bit k: key 32 warp + k is unmapped) and arrives on `full` for it: every
  // thread once its cp.async copies land, lane 0 with the warp's TMA bytes (which publishes the
  // word).
  __device__ __forceinline__ void issue(int tile, int stage, KVRow row, uint64_t* full) const {
    const int lane = key % 32;
    const int warp = key / 32;
    const bool in_range = begin + tile * C::kTile + key < end;
    const int64_t offset = in_range ? p.kv.offset(row, kv_head) : -1;
    const bool unmapped = in_range && offset < 0;
    const uint32_t word = __ballot_sync(0xffffffffu, unmapped);
    const uint32_t bulk = bulk_lanes(offset, lane);
    T* k_stage = k_ring + stage * C::kTileElems;
    T* v_stage = v_ring + stage * C::kTileElems;
    if (lane == 0) {
      mask_words[stage * C::kMaskWords + warp] = word;
      mbarrier_arrive_expect_tx(full, __popc(bulk) * 2 * C::kHeadDim * sizeof(T));
    }
    if (((bulk >> lane) & 1u) && (lane & (p.tma.box_rows - 1)) == 0) {
      const int storage_row = static_cast<int>(offset / C::kHeadDim);
#pragma unroll
      for (int block = 0; block < C::kHeadDim / 64; ++block) {
        const int dst = (block * C::kTile + key) * 64;  // the run's rows in column block `block`
        tma_load_2d(k_stage + dst, &p.tma.k, block * 64, storage_row, full);
        tma_load_2d(v_stage + dst, &p.tma.v, block * 64, storage_row, full);
      }
    }
    if (bulk != 0xffffffffu) {
      copy_warp_rows<C::kTile, C::kHeadDim, T>(offset, warp, lane, bulk,
                                               [&](int dst, int64_t src, bool valid) {
                                                 cp_async_16(k_stage + dst, p.k + src, valid);
                                                 cp_async_16(v_stage + dst, p.v + src, valid);
                                               });
    }
    mbarrier_arrive_on_cp_async(full);
  }
};

// S = Q K^T of one warp's 16 rows (the first at row0 of the Q tile), in the accumulator layout,
// one score at a time with CUDA-core FMAs from the shared tiles: the lazy max's rare recompute,
// which one warp may need without the rest of its warpgroup (a wgmma needs all four warps).
// Written to need few registers, as it sits inside the main loop.
template <typename C, typename T>
__device__ __forceinline__ void scores_from_shared(float (&s)[C::kScoreBlocks][4], const T* q_tile,
                                                   const T* k_stage, int row0, int lane) {
  lane = opaque(lane);  // the addresses below stay out of the main loop's registers
#pragma unroll
  for (int n = 0; n < C::kScoreBlocks; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = row0 + lane / 4 + 8 * (e / 2);
      const int key = 8 * n + 2 * (lane % 4) + (e & 1);
      float acc = 0.0f;
#pragma unroll 1
      for (int chunk = 0; chunk < C::kHeadDim / 8; ++chunk) {
        float q[8];
        float k[8];
        load_float<T, 8>(q_tile + swizzle128_position<C::kRows>(row, chunk), q);
        load_float<T, 8>(k_stage + swizzle128_position<C::kTile>(key, chunk), k);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc = fmaf(q[i], k[i], acc);
      }
      s[n][e] = acc;
    }
  }
}

template <typename T, int kStages, typename KV>
__global__ void __launch_bounds__(WgmmaConfig<T, kStages>::kThreads, 1)
    attention_wgmma_kernel(const __grid_constant__ AttentionParams<T, KV> p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // the compute_90 PTX (later GPUs) has no wgmma: the launcher picks it on 9.0 only
#else
  using C = WgmmaConfig<T, kStages>;
  constexpr int kHeadDim = C::kHeadDim;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t misalign = shared_address(smem_raw) % kSwizzleAtomBytes;
  unsigned char* smem = smem_raw + (misalign ? kSwizzleAtomBytes - misalign : 0);
  T* k_ring = reinterpret_cast<T*>(smem + C::kKOffset);
  T* v_ring = reinterpret_cast<T*>(smem + C::kVOffset);
  T* q_tile = reinterpret_cast<T*>(smem + C::kQOffset);
  uint32_t* mask_words = reinterpret_cast<uint32_t*>(smem + C::kMaskOffset);
  CtaRows* items = reinterpret_cast<CtaRows*>(smem + C::kItemOffset);  // [2], by item parity
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + C::kBarrierOffset);
  uint64_t* empty = full + kStages;
  uint64_t* q_full = empty + kStages;
  uint64_t* q_empty = q_full + 1;

  const int tid = threadIdx.x;
  const PersistentSchedule schedule{PersistentSchedule::count(p)};
  const int rounds = schedule.rounds();

  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], C::kProducerThreads + C::kProducerThreads / 32);
      mbarrier_init(&empty[s], C::kConsumerThreads / 32);
    }
    mbarrier_init(q_full, C::kProducerThreads + 1);
    mbarrier_init(q_empty, C::kConsumerThreads / 32);
  }
  __syncthreads();  // the last CTA-wide barrier: from here on the warpgroups run apart

  // Both sides count the CTA's work items (the parity of q_full / q_empty, the slot in items)
  // and its K/V tiles over all items (the stage and parity in the ring).
  int items_done = 0;
  int tiles_done = 0;

  if (tid >= C::kConsumerThreads) {  // producer
    release_registers<C::kProducerRegs>();
    const int thread = tid - C::kConsumerThreads;
    // Each item's request length and first-tile pages are loaded one item ahead, so an item
    // switch issues its Q and first K/V copies without waiting on a global load (which the
    // consumers, waiting on q_full, would wait for too).
    // Only lane 0 loads the length and the others take it by shuffle when the item starts: a
    // warp-uniform load would go to a uniform register right away, waiting for it there.
    struct Ahead {
      WorkItem w;
      int32_t length;  // p.kv.length(w.b) in lane 0
      KVRow first;     // this thread's key of the item's first tile
    };
    auto load_ahead = [&](int index) -> Ahead {
      const WorkItem w = PersistentSchedule::item_at(p, index);
      return {w, thread % 32 == 0 ? p.kv.length(w.b) : 0,
              p.kv.locate(w.b, chunk_begin(p, w.split) + thread)};
    };
    int index = schedule.item_index(0);
    Ahead ahead = index >= 0 ? load_ahead(index) : Ahead{};
    // Only the last round can have no item for this CTA (the consumers `continue` there).
    for (int round = 0; round < rounds && index >= 0; ++round) {
      // Thread t copies Q row t (C::kRows == C::kProducerThreads); its rows need no load.
      auto copy_q = [&, w = ahead.w] {
        const RowSpan rows = item_rows(p, C::kRows, w);
        const int q_row = rows.begin + thread;
        const int64_t q_offset = q_row < rows.end ? q_row_offset(p, w.b, w.kv_head, q_row) : -1;
        copy_warp_rows<C::kRows, kHeadDim, T>(q_offset, thread / 32, thread % 32, 0u,
                                              [&](int dst, int64_t src, bool valid) {
                                                cp_async_16(q_tile + dst, p.q + src, valid);
                                              });
        mbarrier_arrive_on_cp_async(q_full);
      };
      // The kernel's first Q goes before anything waits on a global load (the request length,
      // the block table); q_full still waits for items[] (thread 0's arrival below).
      if (items_done == 0) copy_q();
      const int num_keys = p.kv.keys(__shfl_sync(0xffffffffu, ahead.length, 0));
      const CtaRows cta = cta_rows(p, C::kRows, ahead.w, num_keys);
      KVRow next = ahead.first;
      index = round + 1 < rounds ? schedule.item_index(round + 1) : -1;
      if (index >= 0) ahead = load_ahead(index);
      const KVTileProducer<T, C, KV> producer{.p = p,
                                              .k_ring = k_ring,
                                              .v_ring = v_ring,
                                              .mask_words = mask_words,
                                              .b = cta.w.b,
                                              .kv_head = cta.w.kv_head,
                                              .begin = cta.range.begin,
                                              .end = cta.range.end,
                                              .key = thread};
      const int num_tiles = tile_count<C::kTile>(cta.range.begin, cta.range.end);
      auto stream_tile = [&](int tile) {
        const KVRow row = next;
        // The next tile's block-table load, in flight through the wait and this tile's copies.
        // None past the item's last tile: nothing reads it.
        if (tile + 1 < num_tiles) next = producer.locate(tile + 1);
        const int stage = tiles_done % kStages;
        if (tiles_done >= kStages) mbarrier_wait(&empty[stage], (tiles_done / kStages - 1) & 1);
        producer.issue(tile, stage, row, &full[stage]);
        ++tiles_done;
      };
      // The first tile's stage is freed before the previous item's Q: stream it before
      // waiting on q_empty.
      if (num_tiles > 0) stream_tile(0);
      if (items_done > 0) mbarrier_wait(q_empty, (items_done - 1) & 1);
      if (thread == 0) items[items_done % 2] = cta;
      if (items_done > 0) copy_q();
      if (thread == 0) mbarrier_arrive(q_full);  // publishes items[]
      for (int tile = 1; tile < num_tiles; ++tile) stream_tile(tile);
      ++items_done;
    }
    // No cp.async outlives its thread; the TMA copies land before the consumers, which wait on
    // full for every tile, let the CTA exit.
    cp_async_wait_all();
    return;
  }

  claim_registers<C::kConsumerRegs>();
  const int lane = tid % 32;
  // Warp-uniform to the compiler (a shuffle from lane 0), so the descriptors built from it live
  // in uniform registers.
  const int group = __shfl_sync(0xffffffffu, tid / 128, 0);
  const int group_row0 = group * C::kGroupRows;              // this warpgroup's first row
  const int warp_row0 = group_row0 + (tid / 32) % 4 * 16;  // this warp's first row
  const float c = positive_scale(p.scale_log2);

  // Descriptors of stage 0; a stage, column block or k step adds its byte offset >> 4 to the
  // start address field (the low 14 bits, which never carry: shared memory is < 256 KB).
  const uint64_t k_desc = smem_descriptor(k_ring, 16, kSwizzleAtomBytes);
  // This warpgroup's 64 rows of Q, K-major like K (column blocks kRows rows apart).
  const uint64_t q_desc = smem_descriptor(q_tile + group_row0 * 64, 16, kSwizzleAtomBytes);
  const uint64_t v_desc = smem_descriptor(v_ring, C::kTile * 128, kSwizzleAtomBytes);
  auto stage_offset = [](int seq) -> uint64_t { return ((seq % kStages) * C::kTileBytes) >> 4; };
  const int my_turn = C::kTurnBarrier0 + group;
  const int other_turn = C::kTurnBarrier0 + 1 - group;

  for (int round = 0; round < rounds; ++round) {
    if (schedule.item_index(round) < 0) continue;
    mbarrier_wait(q_full, items_done & 1);
    const CtaRows& cta = items[items_done % 2];
    const int begin = cta.range.begin;
    const int num_tiles = tile_count<C::kTile>(begin, cta.range.end);
    const int unmasked_end = min(cta.range.all_rows, cta.range.end);
    // Key limits of this thread's rows g (h = 0) and g + 8 (h = 1), and the keys this
    // warpgroup needs at all (its last row's limit).
    int limit[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      limit[h] = cta.limit(p, cta.row_begin + warp_row0 + lane / 4 + 8 * h);
    }
    const int group_last = min(cta.row_begin + group_row0 + C::kGroupRows, cta.row_end) - 1;
    const int group_end = group_last >= cta.row_begin + group_row0 ? cta.limit(p, group_last) : 0;

    if (p.scale_log2 <= 0.0f) {
      fold_scale_sign<C::kConsumerThreads>(q_tile, C::kRows * kHeadDim, p.scale_log2);
    }
    fence_proxy_async();  // Q, written by cp.async (and the fold), is read by wgmma
    if (p.scale_log2 <= 0.0f) named_barrier_sync(C::kConsumerBarrier, C::kConsumerThreads);

    // Consumer 0 goes first: the ping-pong's first turn is its own arrival.
    if (group == 0 && num_tiles > 0) named_barrier_arrive(my_turn, C::kConsumerThreads);

    float o[C::kOutBlocks][4] = {};
    float m[2] = {-INFINITY, -INFINITY};
    float d[2] = {};
    uint32_t pf[C::kKeySteps][4];  // P of this tile, for its P V
    auto release_stage = [&](int seq) {
      if (lane == 0) mbarrier_arrive(&empty[seq % kStages]);
    };
    // After the item's last Q K^T (or its last tile, when it computes none) Q may be replaced.
    auto release_q = [&](int i) {
      if (i == num_tiles - 1 && lane == 0) mbarrier_arrive(q_empty);
    };
    // The other consumer's turn to run its softmax; consumer 1 skips its last arrival, which
    // nobody waits for.
    auto pass_turn = [&](int i) {
      if (group == 0 || i + 1 < num_tiles) named_barrier_arrive(other_turn, C::kConsumerThreads);
    };
    // O += P V of tile `seq` (asynchronous, one commit group): k step kb reads key rows
    // 16 kb .. +15 (two swizzle atoms); the n = 128 columns span two column blocks kTile rows
    // apart.
    auto issue_pv = [&](int seq) {
      fence_registers(o);
      fence_registers(pf);
      wgmma_fence();
#pragma unroll
      for (int kb = 0; kb < C::kKeySteps; ++kb) {
        wgmma_rs<T, 1>(o, pf[kb], v_desc + stage_offset(seq) + ((kb * 16 * 128) >> 4), 1);
      }
      wgmma_commit();
    };

    for (int i = 0; i < num_tiles; ++i) {
      const int seq = tiles_done + i;
      mbarrier_wait(&full[seq % kStages], (seq / kStages) & 1);
      // The tile's cp.async rows are read by wgmma (TMA rows are async-proxy writes already).
      fence_proxy_async();
      const int t0 = begin + i * C::kTile;
      const bool compute = t0 < group_end;  // uniform across the warpgroup, as wgmma requires

      // Each wgmma is waited for in the branch that issued it: ptxas serialises every wgmma
      // (C7514 / C7518) when it cannot prove an accumulator untouched between issue and wait on
      // every path.
      if (compute) {
        // S = Q K^T: k step ds reads dims 16 ds .. +15 of every query and key row, 32 (ds % 4)
        // bytes into the 128-byte rows of column block ds / 4.
        float s[C::kScoreBlocks][4];  // overwritten (scale-d = 0) by the first step
        wgmma_fence();
#pragma unroll
        for (int ds = 0; ds < C::kDimSteps; ++ds) {
          const uint32_t k_offset = (ds / 4) * C::kTile * 128 + (ds % 4) * 32;
          const uint32_t q_offset = (ds / 4) * C::kRows * 128 + (ds % 4) * 32;
          wgmma_ss<T>(s, q_desc + (q_offset >> 4), k_desc + stage_offset(seq) + (k_offset >> 4),
                      ds > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        fence_registers(s);
        release_q(i);
        const uint32_t* words = mask_words + (seq % kStages) * C::kMaskWords;
        uint32_t any_unmapped = 0;
#pragma unroll
        for (int k = 0; k < C::kMaskWords; ++k) any_unmapped |= words[k];
        const bool masked = t0 + C::kTile > unmasked_end || any_unmapped != 0;
        auto mask = [&] {
          auto mapped = [words](int key) {
            const auto k = static_cast<unsigned>(key);  // >= 0: the division is a shift
            return ((words[k / 32] >> (k % 32)) & 1u) == 0;
          };
          mask_scores(s, mapped, 0, t0, limit, lane);
        };
        if (masked) mask();
        // The ping-pong orders the two warpgroups' softmaxes (cuDNN's order): each runs its
        // exponentials with the MUFU pipes to itself, its MMAs issued whenever it is ready.
        named_barrier_sync(my_turn, C::kConsumerThreads);
        float alpha[2];
        bool rescale = false;
        // P for this tile's P V, packed where p is final (pf is free: the last P V completed).
        auto pack_p = [&] {
#pragma unroll
          for (int kb = 0; kb < C::kKeySteps; ++kb) probabilities_fragment<T>(s, kb, pf[kb]);
        };
        // Once every row of the warp has a max, the tile's max is rarely needed
        // (softmax_scores_lazy_max); not on the item's last tile, as the recompute reads Q,
        // which may already be the next item's there (release_q).
        bool max_first = true;
        if (i + 1 < num_tiles &&
            __all_sync(0xffffffffu, m[0] != -INFINITY && m[1] != -INFINITY)) {
          const LazyMax lazy = softmax_scores_lazy_max(s, m, d, c, alpha, pack_p);
          if (lazy == LazyMax::kOverflow) {  // rare: S again, from K's stage and Q
            scores_from_shared<C>(s, q_tile, k_ring + (seq % kStages) * C::kTileElems, warp_row0,
                                  lane);
            if (masked) mask();
          } else {
            max_first = false;
            rescale = lazy == LazyMax::kMoved;
          }
        }
        if (max_first) {
          softmax_scores(s, m, d, c, alpha);
          pack_p();
          // Skipped (warp-uniformly) when no row of the warp has a new max.
          rescale = __any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f);
        }
        pass_turn(i);
        if (rescale) rescale_rows(o, alpha);
        issue_pv(seq);  // cuDNN's order: this tile's P V right after its softmax, waited for
        wgmma_wait<0>();
        fence_registers(o);
        release_stage(seq);
      } else {  // this warpgroup's rows end before tile i
        named_barrier_sync(my_turn, C::kConsumerThreads);
        pass_turn(i);
        release_q(i);
        release_stage(seq);  // not read by this warpgroup
      }
    }
    if (num_tiles == 0 && lane == 0) mbarrier_arrive(q_empty);
    tiles_done += num_tiles;
    store_fragment_rows<T>(p, cta, cta.row_begin + warp_row0, o, m, d, lane);
    ++items_done;
  }
#endif
}

}  // namespace pagekernels::cuda
