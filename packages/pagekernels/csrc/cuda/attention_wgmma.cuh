// Hopper prefill kernel (wgmma, sm_90a) for float16 and bfloat16 at D = 128: the prefill
// schedule's 128-row tiles (L * G > 64 packed rows), where mma.sync reached ~250 TFLOP/s.
//
// CTA = 2 warpgroups x 64 packed query rows, sharing one cp.async ring of 128-key K/V tiles
// (kv_ring.cuh, stored with the 128-byte swizzle that wgmma descriptors read). Q is loaded once
// into registers as A fragments. Per warpgroup, in FlashAttention-3's intra-warpgroup order:
//   iteration j:  S_j = Q K_j^T         wgmma m64n128k16, A = Q (registers), B = K tile (K-major)
//                 O += P_{j-1} V_{j-1}  wgmma m64n128k16, A = P (registers), B = V tile read
//                                       MN-major (transpose-B), so V needs no transposed copy
//                 wait for S_j; mask (only tiles crossing a row's causal limit, the chunk end
//                 or an unmapped page) and online softmax of S_j while P V runs on the tensor
//                 cores; wait for P V; rescale O by the new row maxima; P_j = S_j as bf16/f16
// A warpgroup whose rows end before a tile (causal) skips its math but keeps the barriers. The
// ring refills a stage two tiles after its keys were used, once P V has read its values. The
// async register protocol: wgmma_fence before an MMA batch, fence_registers on every register
// array an in-flight wgmma reads or writes (S, O, P) after its wait, so the compiler moves no
// access across it.
#pragma once

#include "cuda/attention_common.cuh"
#include "cuda/kv_ring.cuh"
#include "cuda/kv_source.cuh"
#include "cuda/mma_tile.cuh"
#include "cuda/wgmma.cuh"

namespace pagekernels::cuda {

template <typename T, int kHeadDim, int kTileArg, int kStagesArg>
struct WgmmaConfig {
  // D = 64 (one 64-column block, n = 64 for P V) gave wrong results past the first key tile on
  // the H200 and stays on attention_mma.
  static_assert(kHeadDim == 128, "wgmma path: D = 128");
  static constexpr int kWarpGroups = 2;
  static constexpr int kThreads = 128 * kWarpGroups;
  static constexpr int kGroupRows = 64;  // the m of wgmma
  static constexpr int kRows = kGroupRows * kWarpGroups;
  static constexpr int kTile = kTileArg;  // keys per pipeline stage: the n of Q K^T
  // 64-key tiles measured 1.14x slower at L = 4096 (docs/performance.md, session 6).
  static_assert(kTile == 128, "n = 128");
  static constexpr int kStages = kStagesArg;
  static_assert(kStages >= 3, "tiles j - 1 (P V) and j (S) in use while j + 1 loads");
  static constexpr int kAhead = 1;
  static constexpr uint32_t kTileBytes = kTile * kHeadDim * sizeof(T);
  static constexpr int kDimSteps = kHeadDim / 16;  // k16 steps of Q K^T
  static constexpr int kKeySteps = kTile / 16;     // k16 steps of P V
  static constexpr int kScoreBlocks = kTile / 8;
  static constexpr int kOutBlocks = kHeadDim / 8;
  static constexpr int kOutStride = kHeadDim + 8;  // fp32 epilogue rows, padded against conflicts
  using Ring = KVRing<T, kTile, kHeadDim, kStages, kThreads, TileLayout::kSwizzle128>;
  // The Q tile borrows the last K stages: the prologue fills stages 0 .. kStages - 3 only, and
  // Q is in registers before the loop's first refill.
  static constexpr int kQStages = (kRows * kHeadDim * sizeof(T)) / kTileBytes;
  static_assert(kQStages * kTileBytes == kRows * kHeadDim * sizeof(T) && kQStages <= 2,
                "Q fits the K stages the prologue leaves empty");
  // Slack to start the tiles on a 1024-byte boundary, which the swizzle pattern needs.
  static constexpr size_t kSmemBytes = Ring::kSmemBytes + kSwizzleAtomBytes;
  static_assert(kRows * (kOutStride + 2) * sizeof(float) <= Ring::kRingBytes,
                "epilogue scratch reuses the K/V ring");
};

template <typename T, int kHeadDim, int kTile, int kStages, typename KV>
__global__ void __launch_bounds__(256, 1)
    attention_wgmma_kernel(const __grid_constant__ AttentionParams<T, KV> p) {
  using C = WgmmaConfig<T, kHeadDim, kTile, kStages>;

  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t misalign = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw)) %
                            kSwizzleAtomBytes;
  unsigned char* smem = smem_raw + (misalign ? kSwizzleAtomBytes - misalign : 0);

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int group_row0 = (tid / 128) * C::kGroupRows;      // this warpgroup's first row
  const int warp_row0 = group_row0 + (tid / 32) % 4 * 16;  // this warp's first row
  const CtaRows cta = cta_rows(p, C::kRows);
  const auto& [w, num_keys, row_begin, row_end, range] = cta;
  const typename C::Ring ring(smem, p.k, p.v, w.b, w.kv_head, range.begin, range.end,
                              kHeadDim);
  T* q_tile = ring.k_ring + (kStages - C::kQStages) * kTile * kHeadDim;  // 128-byte swizzle
  const int unmasked_end = min(range.all_rows, range.end);

  // Key limits of this thread's rows g (h = 0) and g + 8 (h = 1), and the keys this warpgroup
  // needs at all (its last row's limit).
  int limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) limit[h] = cta.limit(p, row_begin + warp_row0 + lane / 4 + 8 * h);
  const int group_last = min(row_begin + group_row0 + C::kGroupRows, row_end) - 1;
  const int group_end = group_last >= row_begin + group_row0 ? cta.limit(p, group_last) : 0;

  // Q tile in its own cp.async group, ahead of every K/V group.
  load_q_tile<C::kRows, kHeadDim, C::kThreads>(p, cta, q_tile, [](int row, int chunk) {
    return swizzle128_position<C::kRows>(row, chunk);
  });

  KVRow window[C::kAhead];
  UnmappedTiles<kStages, C::Ring::kOffsetSlots> unmapped;
  unmapped.start(ring.start(p.kv, window));
  for (int s = 0; s < kStages - 2; ++s) ring.issue(s);

  const float c = positive_scale(p.scale_log2);
  cp_async_wait<kStages - 2>();  // the Q group
  __syncthreads();
  if (p.scale_log2 <= 0.0f) {
    fold_scale_sign<C::kThreads>(q_tile, C::kRows * kHeadDim, p.scale_log2);
    __syncthreads();
  }
  uint32_t qf[C::kDimSteps][4];  // this warp's 16 rows of Q as A fragments
#pragma unroll
  for (int ds = 0; ds < C::kDimSteps; ++ds) {
    ldmatrix_x4(qf[ds],
                q_tile + swizzle128_position<C::kRows>(warp_row0 + lane % 16, 2 * ds + lane / 16));
  }

  // Descriptors of stage 0; a stage, column block or k step adds its byte offset >> 4 to the
  // start address field (the low 14 bits, which never carry: shared memory is < 256 KB).
  const uint64_t k_desc = smem_descriptor(ring.k_tile(0), 16, kSwizzleAtomBytes);
  const uint64_t v_desc = smem_descriptor(ring.v_tile(0), kTile * 128, kSwizzleAtomBytes);
  auto stage_offset = [](int tile) -> uint64_t {
    return ((tile % kStages) * C::kTileBytes) >> 4;
  };

  float o[C::kOutBlocks][4] = {};
  float m[2] = {-INFINITY, -INFINITY};
  float d[2] = {};
  uint32_t pf[C::kKeySteps][4];  // P of the previous tile, waiting for its P V
  bool has_p = false;
  bool pending_unmapped = false;

  // O += P V of `tile` (asynchronous, one commit group): k step kb reads key rows 16 kb .. +15
  // (two swizzle atoms); the n = 128 columns span two column blocks kTile rows apart.
  auto issue_pv = [&](int tile) {
    fence_registers(o);
    fence_registers(pf);
    wgmma_fence();
#pragma unroll
    for (int kb = 0; kb < C::kKeySteps; ++kb) {
      wgmma_rs<T, 1>(o, pf[kb], v_desc + stage_offset(tile) + ((kb * 16 * 128) >> 4), 1);
    }
    wgmma_commit();
  };

  for (int i = 0; i < ring.num_tiles; ++i) {
    cp_async_wait<kStages - 3>();
    fence_proxy_async();  // tile i's bytes, written by cp.async, are read by wgmma
    unmapped.barrier(i, pending_unmapped);
    ring.issue(i + kStages - 2);  // into the stage of tile i - 2, whose P V is done

    const int t0 = ring.first_key(i);
    if (t0 < group_end) {  // uniform across the warpgroup, as wgmma requires
      // S = Q K^T: k step ds reads dims 16 ds .. +15 of every key row, 32 bytes into the
      // 128-byte rows of column block ds / 4.
      float s[C::kScoreBlocks][4];  // overwritten (scale-d = 0) by the first step
      wgmma_fence();
#pragma unroll
      for (int ds = 0; ds < C::kDimSteps; ++ds) {
        const uint32_t offset = (ds / 4) * kTile * 128 + (ds % 4) * 32;
        wgmma_rs<T, 0>(s, qf[ds], k_desc + stage_offset(i) + (offset >> 4), ds > 0);
      }
      wgmma_commit();
      if (has_p) {
        issue_pv(i - 1);
        wgmma_wait<1>();  // S only; P V keeps the tensor cores busy during the softmax
      } else {
        wgmma_wait<0>();
      }
      fence_registers(s);

      if (t0 + kTile > unmasked_end || unmapped(i)) {
        mask_scores(s, ring.mapped(i), 0, t0, limit, lane);
      }
      float alpha[2];
      softmax_scores(s, m, d, c, alpha);
      wgmma_wait<0>();
      fence_registers(o);
      fence_registers(pf);  // the P V just waited for read pf: overwrite it only from here
      // Skipped (warp-uniformly) when no row of the warp has a new max, the common case after
      // a row's first tiles.
      if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) rescale_rows(o, alpha);
#pragma unroll
      for (int kb = 0; kb < C::kKeySteps; ++kb) probabilities_fragment<T>(s, kb, pf[kb]);
      has_p = true;
    } else if (has_p) {  // this warpgroup's rows end here: apply its last P
      issue_pv(i - 1);
      wgmma_wait<0>();
      fence_registers(o);
      has_p = false;
    }
    pending_unmapped = ring.advance(p.kv, i, window);
  }
  if (has_p) {
    issue_pv(ring.num_tiles - 1);
    wgmma_wait<0>();
    fence_registers(o);
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free from here on

  float* scratch = reinterpret_cast<float*>(smem);  // [kRows][kOutStride]
  float* stats = scratch + C::kRows * C::kOutStride;  // [kRows][2]
  park_rows<C::kOutBlocks, C::kOutStride>(scratch, stats, warp_row0, o, m, d, lane);
  __syncthreads();
  write_parked_rows<T, kHeadDim, C::kRows, 1, C::kOutStride, C::kThreads>(p, w, row_begin,
                                                                          row_end, scratch, stats);
}

}  // namespace pagekernels::cuda
