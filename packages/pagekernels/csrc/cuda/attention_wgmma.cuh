// Hopper prefill kernel, warp-specialised and persistent (wgmma, sm_90a), for float16 and
// bfloat16 at D = 128: the prefill schedule's 128-row tiles (L * G > 64 packed rows).
//
// One CTA per SM walks a sequence of work items (PersistentSchedule: longest first, snake order
// across CTAs), so one item's prologue and epilogue overlap the next item's loads instead of
// leaving the tensor cores idle between CTAs.
//
// CTA = 3 warpgroups. Warpgroups 0 and 1 (consumers) own 64 packed query rows each; warpgroup 2
// (producer) resolves each item's rows, loads its Q tile into one of two Q buffers and streams
// its 128-key tiles, K into a ring of kKStages stages and V into one of kVStages, doing every
// block-table lookup and address calculation. Buffers change hands through mbarriers:
//   k_full[s]  completes when the tile's K copies have landed (each producer thread arrives once
//              its cp.async copies complete, and each producer warp's lane 0 after storing the
//              stage's unmapped-key words); v_full[s] the same for V (copies only);
//   k_empty[s] completes when both consumer warpgroups are done with the K tile: one arrival
//              per consumer warp once its Q K^T has completed (or at once from a warpgroup whose
//              rows end before the tile); v_empty[s] the same for V, after P V;
//   q_full[b]  completes when an item's Q tile has landed and its CtaRows are in shared memory;
//   q_empty[b] completes when every consumer warp has finished the item (epilogue included).
// K is freed right after S and V only after P V, so K needs fewer stages than V; with two Q
// buffers the producer loads the next item's Q while the consumers finish this one.
// No CTA-wide barrier runs inside the loops, so the two consumers drift apart; named barriers
// keep them half a tile apart (FlashAttention-3's ping-pong): consumer g issues its MMAs only
// after the other issued theirs, so one warpgroup's softmax runs under the other's MMAs. The
// turns alternate over the CTA's tiles of all its items, which also keeps either consumer from
// running more than a tile ahead of the other (the stage releases below rely on it). Inside a
// consumer the loop follows FlashAttention-3's intra-warpgroup order (Q K^T reads Q from shared
// memory, which leaves the registers to S, O and P): issue S_j = Q K_j^T and
// O += P_{j-1} V_{j-1}, wait for S_j, free K_j, mask + softmax while P V runs, wait, free
// V_{j-1}, rescale O, pack P_j. Outputs go from the accumulators straight to global memory. The
// producer gives registers back (setmaxnreg) so the consumers can hold S, O and P.
#pragma once

#include "cuda/attention_common.cuh"
#include "cuda/kv_source.cuh"
#include "cuda/mma_tile.cuh"
#include "cuda/warp_specialization.cuh"
#include "cuda/wgmma.cuh"

namespace pagekernels::cuda {

template <typename T, int kKStagesArg, int kVStagesArg>
struct WgmmaConfig {
  static constexpr int kHeadDim = 128;
  static constexpr int kConsumerThreads = 256;  // warpgroups 0 and 1
  static constexpr int kProducerThreads = 128;  // warpgroup 2
  static constexpr int kThreads = kConsumerThreads + kProducerThreads;
  static constexpr int kGroupRows = 64;  // the m of wgmma
  static constexpr int kRows = 2 * kGroupRows;
  static constexpr int kTile = 128;  // keys per stage: the n of Q K^T
  static constexpr int kKStages = kKStagesArg;
  static constexpr int kVStages = kVStagesArg;
  static constexpr int kQBuffers = 2;
  // A consumer may release K_j and V_j as soon as it reaches tile j (when its rows end before
  // it) while the other, at most one tile behind, still reads K_{j-1} and V_{j-2}: releases of
  // one stage must not mix two uses of it.
  static_assert(kKStages >= 2 && kVStages >= 3, "see the stage releases in the consumer loop");
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
  static constexpr int kQElems = kRows * kHeadDim;
  static constexpr uint32_t kQBytes = kQElems * sizeof(T);
  static constexpr int kDimSteps = kHeadDim / 16;  // k16 steps of Q K^T
  static constexpr int kKeySteps = kTile / 16;     // k16 steps of P V
  static constexpr int kScoreBlocks = kTile / 8;
  static constexpr int kOutBlocks = kHeadDim / 8;
  static constexpr int kMaskWords = kTile / 32;  // unmapped-key bits of a K stage, one per key

  // Shared memory: K stages, V stages, Q buffers, per-K-stage mask words, one work-item slot per
  // Q buffer, the mbarriers (k_full, k_empty [kKStages], v_full, v_empty [kVStages], q_full,
  // q_empty [kQBuffers]).
  static constexpr size_t kKOffset = 0;
  static constexpr size_t kVOffset = kKOffset + size_t{kKStages} * kTileBytes;
  static constexpr size_t kQOffset = kVOffset + size_t{kVStages} * kTileBytes;
  static constexpr size_t kMaskOffset = kQOffset + size_t{kQBuffers} * kQBytes;
  static constexpr size_t kItemOffset = kMaskOffset + size_t{kKStages} * kMaskWords * 4;
  static constexpr size_t kBarrierOffset = kItemOffset + kQBuffers * sizeof(CtaRows);
  static constexpr int kBarriers = 2 * (kKStages + kVStages + kQBuffers);
  static constexpr size_t kLayoutBytes = kBarrierOffset + size_t{kBarriers} * 8;
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
// copies rows 32 w .. 32 w + 31, lane l having resolved row 32 w + l to the element `offset` of
// its source (< 0: zero-fill) and passing it on by shuffle; lanes take 32-byte pairs of 16-byte
// chunks, 8 lanes per 256-byte row. copy(dst, src, valid) issues one chunk (dst and src are
// element offsets).
template <int kRows, int kHeadDim, typename T, typename Copy>
__device__ __forceinline__ void copy_warp_rows(int64_t offset, int warp, int lane, Copy copy) {
  constexpr int kLanesPerRow = kHeadDim * sizeof(T) / 32;  // one 32-byte pair each
  constexpr int kRowsPerPass = 32 / kLanesPerRow;
  const int chunk = 2 * (lane % kLanesPerRow);
#pragma unroll
  for (int pass = 0; pass < 32 / kRowsPerPass; ++pass) {
    const int row = kRowsPerPass * pass + lane / kLanesPerRow;  // within this warp's 32 rows
    const int64_t off = __shfl_sync(0xffffffffu, offset, row);
    const bool valid = off >= 0;
    const int64_t src = valid ? off + chunk * 8 : 0;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      copy(swizzle128_position<kRows>(32 * warp + row, chunk + c), src + c * 8, valid);
    }
  }
}

// The producer warpgroup's side of one tile: thread `key` resolves that key of the tile and
// stores its warp's unmapped-key word; the warps copy the K and V rows (copy_warp_rows).
template <typename T, typename C, typename KV>
struct KVTileProducer {
  const AttentionParams<T, KV>& p;
  T* k_ring;
  T* v_ring;
  uint32_t* mask_words;  // [kKStages][kMaskWords]
  int b;
  int kv_head;
  int begin;
  int end;
  int key;  // this thread's key within a tile

  __device__ __forceinline__ KVRow locate(int tile) const {
    const int t = begin + tile * C::kTile + key;
    return t < end ? p.kv.locate(b, t) : KVRow{-1, 0};
  }

  // Element offset of this thread's key (looked up in `row`) in the K/V storage, -1 if none.
  __device__ __forceinline__ int64_t offset(KVRow row) const { return p.kv.offset(row, kv_head); }

  // Copies the K rows of `tile` into K stage `stage` as cp.async copies and stores the stage's
  // mask word of this warp (bit k: key 32 warp + k is unmapped).
  __device__ __forceinline__ void issue_k(int tile, int stage, int64_t offset) const {
    const int lane = key % 32;
    const int warp = key / 32;
    const bool unmapped = offset < 0 && begin + tile * C::kTile + key < end;
    const uint32_t word = __ballot_sync(0xffffffffu, unmapped);
    if (lane == 0) mask_words[stage * C::kMaskWords + warp] = word;
    T* k_stage = k_ring + stage * C::kTileElems;
    copy_warp_rows<C::kTile, C::kHeadDim, T>(
        offset, warp, lane,
        [&](int dst, int64_t src, bool valid) { cp_async_16(k_stage + dst, p.k + src, valid); });
  }

  // Copies the V rows of the same tile into V stage `stage`.
  __device__ __forceinline__ void issue_v(int stage, int64_t offset) const {
    T* v_stage = v_ring + stage * C::kTileElems;
    copy_warp_rows<C::kTile, C::kHeadDim, T>(
        offset, key / 32, key % 32,
        [&](int dst, int64_t src, bool valid) { cp_async_16(v_stage + dst, p.v + src, valid); });
  }
};

template <typename T, int kKStages, int kVStages, typename KV>
__global__ void __launch_bounds__(WgmmaConfig<T, kKStages, kVStages>::kThreads, 1)
    attention_wgmma_kernel(const __grid_constant__ AttentionParams<T, KV> p) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // the compute_90 PTX (later GPUs) has no wgmma: the launcher picks it on 9.0 only
#else
  using C = WgmmaConfig<T, kKStages, kVStages>;
  constexpr int kHeadDim = C::kHeadDim;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t misalign = shared_address(smem_raw) % kSwizzleAtomBytes;
  unsigned char* smem = smem_raw + (misalign ? kSwizzleAtomBytes - misalign : 0);
  T* k_ring = reinterpret_cast<T*>(smem + C::kKOffset);
  T* v_ring = reinterpret_cast<T*>(smem + C::kVOffset);
  T* q_tiles = reinterpret_cast<T*>(smem + C::kQOffset);  // [kQBuffers][kRows x kHeadDim]
  uint32_t* mask_words = reinterpret_cast<uint32_t*>(smem + C::kMaskOffset);
  CtaRows* items = reinterpret_cast<CtaRows*>(smem + C::kItemOffset);  // [kQBuffers]
  uint64_t* k_full = reinterpret_cast<uint64_t*>(smem + C::kBarrierOffset);
  uint64_t* k_empty = k_full + kKStages;
  uint64_t* v_full = k_empty + kKStages;
  uint64_t* v_empty = v_full + kVStages;
  uint64_t* q_full = v_empty + kVStages;
  uint64_t* q_empty = q_full + C::kQBuffers;

  const int tid = threadIdx.x;
  const PersistentSchedule schedule{PersistentSchedule::count(p)};
  const int rounds = schedule.rounds();

  if (tid == 0) {
    for (int s = 0; s < kKStages; ++s) {
      mbarrier_init(&k_full[s], C::kProducerThreads + C::kProducerThreads / 32);
      mbarrier_init(&k_empty[s], C::kConsumerThreads / 32);
    }
    for (int s = 0; s < kVStages; ++s) {
      mbarrier_init(&v_full[s], C::kProducerThreads);
      mbarrier_init(&v_empty[s], C::kConsumerThreads / 32);
    }
    for (int q = 0; q < C::kQBuffers; ++q) {
      mbarrier_init(&q_full[q], C::kProducerThreads + 1);
      mbarrier_init(&q_empty[q], C::kConsumerThreads / 32);
    }
  }
  __syncthreads();  // the last CTA-wide barrier: from here on the warpgroups run apart

  // Both sides count the CTA's work items (Q buffer = items_done % kQBuffers, its use count =
  // items_done / kQBuffers) and its tiles over all items (stage = tiles_done % stages, use count
  // = tiles_done / stages); an mbarrier wait names the use by its parity.
  int items_done = 0;
  int tiles_done = 0;

  if (tid >= C::kConsumerThreads) {  // producer
    release_registers<C::kProducerRegs>();
    const int thread = tid - C::kConsumerThreads;
    for (int round = 0; round < rounds; ++round) {
      const int index = schedule.item(round);
      if (index < 0) continue;
      const CtaRows cta = cta_rows(p, C::kRows, PersistentSchedule::work_item(p, index));
      // Q: thread t copies row t (C::kRows == C::kProducerThreads), once the consumers are done
      // with the item that last used this buffer.
      const int buffer = items_done % C::kQBuffers;
      if (items_done >= C::kQBuffers) {
        mbarrier_wait(&q_empty[buffer], (items_done / C::kQBuffers - 1) & 1);
      }
      if (thread == 0) items[buffer] = cta;
      const int q_row = cta.row_begin + thread;
      const int64_t q_offset =
          q_row < cta.row_end ? q_row_offset(p, cta.w.b, cta.w.kv_head, q_row) : -1;
      T* q_tile = q_tiles + buffer * C::kQElems;
      copy_warp_rows<C::kRows, kHeadDim, T>(q_offset, thread / 32, thread % 32,
                                            [&](int dst, int64_t src, bool valid) {
                                              cp_async_16(q_tile + dst, p.q + src, valid);
                                            });
      mbarrier_arrive_on_cp_async(&q_full[buffer]);
      if (thread == 0) mbarrier_arrive(&q_full[buffer]);  // publishes items[buffer]

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
      KVRow next = producer.locate(0);
      for (int tile = 0; tile < num_tiles; ++tile, ++tiles_done) {
        const int64_t offset = producer.offset(next);
        next = producer.locate(tile + 1);  // the block-table load of the next tile, in flight
        const int k_stage = tiles_done % kKStages;
        if (tiles_done >= kKStages) {
          mbarrier_wait(&k_empty[k_stage], (tiles_done / kKStages - 1) & 1);
        }
        producer.issue_k(tile, k_stage, offset);
        mbarrier_arrive_on_cp_async(&k_full[k_stage]);
        if (thread % 32 == 0) mbarrier_arrive(&k_full[k_stage]);  // publishes the mask word
        const int v_stage = tiles_done % kVStages;
        if (tiles_done >= kVStages) {
          mbarrier_wait(&v_empty[v_stage], (tiles_done / kVStages - 1) & 1);
        }
        producer.issue_v(v_stage, offset);
        mbarrier_arrive_on_cp_async(&v_full[v_stage]);
      }
      ++items_done;
    }
    cp_async_wait_all();  // no copy outlives its thread (the consumers wait on them anyway)
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

  // Descriptors of stage / buffer 0; a stage, buffer, column block or k step adds its byte
  // offset >> 4 to the start address field (the low 14 bits, which never carry: shared memory
  // is < 256 KB).
  const uint64_t k_desc = smem_descriptor(k_ring, 16, kSwizzleAtomBytes);
  // This warpgroup's 64 rows of Q, K-major like K (column blocks kRows rows apart).
  const uint64_t q_desc = smem_descriptor(q_tiles + group_row0 * 64, 16, kSwizzleAtomBytes);
  const uint64_t v_desc = smem_descriptor(v_ring, C::kTile * 128, kSwizzleAtomBytes);
  auto k_stage_offset = [](int seq) -> uint64_t {
    return ((seq % kKStages) * C::kTileBytes) >> 4;
  };
  auto v_stage_offset = [](int seq) -> uint64_t {
    return ((seq % kVStages) * C::kTileBytes) >> 4;
  };
  // The ping-pong alternates over every tile of every item: consumer 0 goes first (its own
  // arrival), each consumer arrives for the other after issuing its MMAs, and consumer 0 takes
  // the last arrival of consumer 1 after the last item.
  const int my_turn = C::kTurnBarrier0 + group;
  const int other_turn = C::kTurnBarrier0 + 1 - group;
  if (group == 0) named_barrier_arrive(my_turn, C::kConsumerThreads);
  auto pass_turn = [&] { named_barrier_arrive(other_turn, C::kConsumerThreads); };
  // One arrival per warp, after every lane's reads of the buffer (mask words, items[]).
  auto release = [&](uint64_t* barriers, int stages, int seq) {
    __syncwarp();
    if (lane == 0) mbarrier_arrive(&barriers[seq % stages]);
  };

  for (int round = 0; round < rounds; ++round) {
    if (schedule.item(round) < 0) continue;
    const int buffer = items_done % C::kQBuffers;
    mbarrier_wait(&q_full[buffer], (items_done / C::kQBuffers) & 1);
    const CtaRows& cta = items[buffer];
    const int begin = cta.range.begin;
    const int num_tiles = tile_count<C::kTile>(begin, cta.range.end);
    const int unmasked_end = min(cta.range.all_rows, cta.range.end);
    // Key limits of this thread's rows g (h = 0) and g + 8 (h = 1), and the keys this
    // warpgroup needs at all (its last row's limit).
    int limit[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) limit[h] = cta.limit(p, cta.row_begin + warp_row0 + lane / 4 + 8 * h);
    const int group_last = min(cta.row_begin + group_row0 + C::kGroupRows, cta.row_end) - 1;
    const int group_end = group_last >= cta.row_begin + group_row0 ? cta.limit(p, group_last) : 0;

    if (p.scale_log2 <= 0.0f) {
      fold_scale_sign<C::kConsumerThreads>(q_tiles + buffer * C::kQElems, C::kQElems,
                                           p.scale_log2);
    }
    fence_proxy_async();  // Q, written by cp.async (and the fold), is read by wgmma
    if (p.scale_log2 <= 0.0f) named_barrier_sync(C::kConsumerBarrier, C::kConsumerThreads);
    const uint64_t q_item_desc = q_desc + ((buffer * C::kQBytes) >> 4);

    float o[C::kOutBlocks][4] = {};
    float m[2] = {-INFINITY, -INFINITY};
    float d[2] = {};
    uint32_t pf[C::kKeySteps][4];  // P of the previous tile, waiting for its P V
    bool has_p = false;
    // O += P V of tile `seq` (asynchronous, one commit group): k step kb reads key rows
    // 16 kb .. +15 (two swizzle atoms); the n = 128 columns span two column blocks kTile rows
    // apart.
    auto issue_pv = [&](int seq) {
      fence_registers(o);
      fence_registers(pf);
      wgmma_fence();
#pragma unroll
      for (int kb = 0; kb < C::kKeySteps; ++kb) {
        wgmma_rs<T, 1>(o, pf[kb], v_desc + v_stage_offset(seq) + ((kb * 16 * 128) >> 4), 1);
      }
      wgmma_commit();
    };

    for (int i = 0; i < num_tiles; ++i) {
      const int seq = tiles_done + i;
      mbarrier_wait(&k_full[seq % kKStages], (seq / kKStages) & 1);
      if (has_p) mbarrier_wait(&v_full[(seq - 1) % kVStages], ((seq - 1) / kVStages) & 1);
      fence_proxy_async();  // the tiles' bytes, written by cp.async, are read by wgmma
      const int t0 = begin + i * C::kTile;
      // Uniform across the warpgroup, as wgmma requires. The warpgroup holding the item's last
      // row computes every tile (its limit is range.end), so no tile is skipped by both.
      const bool compute = t0 < group_end;

      // Each wgmma is waited for in the branch that issued it, and P V with an unconditional
      // wait (a no-op on the first tile): ptxas serialises every wgmma (C7514 / C7518) when it
      // cannot prove an accumulator untouched between issue and wait on every path.
      named_barrier_sync(my_turn, C::kConsumerThreads);
      if (compute) {
        // S = Q K^T: k step ds reads dims 16 ds .. +15 of every query and key row, 32 (ds % 4)
        // bytes into the 128-byte rows of column block ds / 4.
        float s[C::kScoreBlocks][4];  // overwritten (scale-d = 0) by the first step
        wgmma_fence();
#pragma unroll
        for (int ds = 0; ds < C::kDimSteps; ++ds) {
          const uint32_t k_offset = (ds / 4) * C::kTile * 128 + (ds % 4) * 32;
          const uint32_t q_offset = (ds / 4) * C::kRows * 128 + (ds % 4) * 32;
          wgmma_ss<T>(s, q_item_desc + (q_offset >> 4),
                      k_desc + k_stage_offset(seq) + (k_offset >> 4), ds > 0);
        }
        wgmma_commit();
        if (has_p) {
          issue_pv(seq - 1);
          pass_turn();
          wgmma_wait<1>();  // S only; P V keeps the tensor cores busy during the softmax
        } else {
          pass_turn();
          wgmma_wait<0>();
        }
        fence_registers(s);
        const uint32_t* words = mask_words + (seq % kKStages) * C::kMaskWords;
        uint32_t any_unmapped = 0;
#pragma unroll
        for (int k = 0; k < C::kMaskWords; ++k) any_unmapped |= words[k];
        if (t0 + C::kTile > unmasked_end || any_unmapped != 0) {
          auto mapped = [words](int key) { return ((words[key / 32] >> (key % 32)) & 1u) == 0; };
          mask_scores(s, mapped, 0, t0, limit, lane);
        }
        release(k_empty, kKStages, seq);  // K and its mask words are no longer read
        float alpha[2];
        softmax_scores(s, m, d, c, alpha);
        wgmma_wait<0>();
        fence_registers(o);
        fence_registers(pf);  // the P V just waited for read pf: overwrite it only from here
        if (has_p) release(v_empty, kVStages, seq - 1);
        // Skipped (warp-uniformly) when no row of the warp has a new max, the common case
        // after a row's first tiles.
        if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) rescale_rows(o, alpha);
#pragma unroll
        for (int kb = 0; kb < C::kKeySteps; ++kb) probabilities_fragment<T>(s, kb, pf[kb]);
        has_p = true;
      } else {  // this warpgroup's rows end before tile i: apply its last P, if any
        if (has_p) {
          issue_pv(seq - 1);
          pass_turn();
          wgmma_wait<0>();
          fence_registers(o);
          release(v_empty, kVStages, seq - 1);
        } else {
          pass_turn();
        }
        // Neither is read by this warpgroup. V is released only once it has landed, so that
        // this warpgroup's later waits on the stage never name a phase still in flight.
        release(k_empty, kKStages, seq);
        mbarrier_wait(&v_full[seq % kVStages], (seq / kVStages) & 1);
        release(v_empty, kVStages, seq);
        has_p = false;
      }
    }
    if (has_p) {
      const int last = tiles_done + num_tiles - 1;
      mbarrier_wait(&v_full[last % kVStages], (last / kVStages) & 1);
      fence_proxy_async();
      issue_pv(last);
      wgmma_wait<0>();
      fence_registers(o);
      release(v_empty, kVStages, last);
    }
    tiles_done += num_tiles;
    store_fragment_rows<T>(p, cta, cta.row_begin + warp_row0, o, m, d, lane);
    release(q_empty, C::kQBuffers, items_done);  // Q and items[buffer] are no longer read
    ++items_done;
  }
  if (group == 0) named_barrier_sync(my_turn, C::kConsumerThreads);  // consumer 1's last turn
#endif
}

}  // namespace pagekernels::cuda
