// Tensor-core attention kernel (FA2-style, mma.sync m16n8k16, fp32 accumulation) for float16 and
// bfloat16 with D = 64 or 128. One template serves both schedules; only the warp layout differs:
//   prefill  kWarpsQ = 4, kWarpsKV = 1: each warp owns kMTiles x 16 packed query rows (64 or 128
//            rows per CTA) and walks all 64 keys of each tile (FA2 / FlashInfer prefill). Two
//            m16 tiles per warp use every K/V fragment loaded by ldmatrix twice.
//   decode   kWarpsQ = 1, kWarpsKV = 4, kMTiles = 1: 16 packed rows (G heads x L <= 8 positions)
//            shared by all warps; each warp takes 16 of the tile's 64 keys and keeps its own
//            (m, d, O), merged through shared memory at the end (FlashInfer's tensor-core decode).
// Per tile and warp: S = Q K^T (Q and K fragments by ldmatrix from shared memory), mask only in
// tiles that cross a row's causal limit, the chunk end or an unmapped page, online softmax in the
// exp2 domain (one FFMA + one ex2 per score), then O += P V with P taken straight from the S
// accumulators and V by ldmatrix.trans. Shared tiles use the 128-byte XOR swizzle
// (16-byte chunk c of row r lives at chunk c ^ (r % 8)), so ldmatrix is free of bank conflicts.
// K/V stream through the cp.async ring of kv_ring.cuh, as in attention_simt.cuh.
#pragma once

#include "cuda/attention_common.cuh"
#include "cuda/kv_ring.cuh"
#include "cuda/kv_source.cuh"
#include "cuda/mma_tile.cuh"

namespace pagekernels::cuda {

template <typename T, int kHeadDim, int kWarpsQ, int kWarpsKV, int kMTilesArg, int kStagesArg>
struct MmaConfig {
  static_assert(kHeadDim == 64 || kHeadDim == 128, "tensor-core path: D = 64 or 128");
  static constexpr int kThreads = 32 * kWarpsQ * kWarpsKV;
  static constexpr int kMTiles = kMTilesArg;    // m16 row tiles per warp
  static constexpr int kWarpRows = 16 * kMTiles;
  static constexpr int kRows = kWarpRows * kWarpsQ;  // packed query rows per CTA
  static constexpr int kTile = 64;                   // keys per pipeline stage
  static constexpr int kStages = kStagesArg;
  // block_table lookahead in tiles (kv_ring.cuh): decode tiles compute too briefly to hide it.
  static constexpr int kAhead = kWarpsKV > 1 ? 4 : 1;
  static constexpr int kWarpKeys = kTile / kWarpsKV;
  // A warp walks its keys in kMTiles passes, so its S accumulators stay at 32 registers.
  static constexpr int kPasses = kMTiles;
  static constexpr int kPassKeys = kWarpKeys / kPasses;
  static_assert(kPassKeys % 16 == 0, "passes take whole 16-key blocks");
  static constexpr int kKeyBlocks = kPassKeys / 16;
  static constexpr int kDimSteps = kHeadDim / 16;  // k16 steps of Q K^T, n16 blocks of P V
  static constexpr int kOutStride = kHeadDim + 8;  // fp32 epilogue rows, padded against conflicts
  using Ring = KVRing<T, kTile, kHeadDim, kStages, kThreads, TileLayout::kSwizzleRow>;
  static constexpr size_t kQBytes = kRows * kHeadDim * sizeof(T);
  static constexpr size_t kSmemBytes = kQBytes + Ring::kSmemBytes;
  static_assert(kWarpsKV * kRows * (kOutStride + 2) * sizeof(float) <= kQBytes + Ring::kRingBytes,
                "epilogue scratch reuses the Q tile and the K/V ring");
};

template <typename T, int kHeadDim, int kWarpsQ, int kWarpsKV, int kMTiles, int kStages,
          typename KV>
__global__ void __launch_bounds__(32 * kWarpsQ * kWarpsKV)
    attention_mma_kernel(const __grid_constant__ AttentionParams<T, KV> p) {
  using C = MmaConfig<T, kHeadDim, kWarpsQ, kWarpsKV, kMTiles, kStages>;
  constexpr int kTile = C::kTile;
  constexpr int kScoreBlocks = 2 * C::kKeyBlocks;  // n8 blocks of S per m16 tile

  extern __shared__ __align__(128) unsigned char smem[];
  T* q_tile = reinterpret_cast<T*>(smem);  // [kRows][kHeadDim], swizzled

  const int tid = threadIdx.x;
  const int lane = tid % 32;
  const int warp_q = (tid / 32) % kWarpsQ;
  const int warp_kv = (tid / 32) / kWarpsQ;
  const CtaRows cta = cta_rows(p, C::kRows, work_item(p));
  const auto& [w, num_keys, row_begin, row_end, range] = cta;
  const typename C::Ring ring(smem + C::kQBytes, p.k, p.v, w.b, w.kv_head, range.begin,
                              range.end, kHeadDim);
  const int unmasked_end = min(range.all_rows, range.end);
  const int warp_row0 = warp_q * C::kWarpRows;  // this warp's first row in the CTA

  // Key limits of this thread's accumulator rows: row g (h = 0) and g + 8 (h = 1) of m-tile mt.
  int limit[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      limit[mt][h] = cta.limit(p, row_begin + warp_row0 + mt * 16 + lane / 4 + 8 * h);
    }
  }

  // Q tile in its own cp.async group, ahead of every K/V group.
  load_q_tile<C::kRows, kHeadDim, C::kThreads>(
      p, cta, q_tile, [](int row, int chunk) { return C::Ring::position(row, chunk); });

  KVRow window[C::kAhead];
  UnmappedTiles<kStages, C::Ring::kOffsetSlots> unmapped;
  unmapped.start(ring.start(p.kv, window));
  for (int s = 0; s < kStages - 1; ++s) ring.issue(s);

  const float c = positive_scale(p.scale_log2);
  if (p.scale_log2 <= 0.0f) {
    cp_async_wait<kStages - 1>();
    __syncthreads();
    fold_scale_sign<C::kThreads>(q_tile, C::kRows * kHeadDim, p.scale_log2);
  }

  float o[kMTiles][kHeadDim / 8][4] = {};
  float m[kMTiles][2];
  float d[kMTiles][2] = {};
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) m[mt][0] = m[mt][1] = -INFINITY;
  bool pending_unmapped = false;

  for (int i = 0; i < ring.num_tiles; ++i) {
    cp_async_wait<kStages - 2>();
    unmapped.barrier(i, pending_unmapped);
    ring.issue(i + kStages - 1);

    const T* ks = ring.k_tile(i);
    const T* vs = ring.v_tile(i);
    const int t0 = ring.first_key(i);
    const bool masked = t0 + kTile > unmasked_end || unmapped(i);
#pragma unroll 1
    for (int pass = 0; pass < C::kPasses; ++pass) {
      const int key0 = warp_kv * C::kWarpKeys + pass * C::kPassKeys;  // first key of this pass

      // S = Q K^T for this warp's keys: s[mt][n] is the 16x8 block of rows mt and keys
      // key0 + 8n .. + 7. Each K fragment serves all kMTiles row tiles.
      float s[kMTiles][kScoreBlocks][4] = {};
#pragma unroll
      for (int ds = 0; ds < C::kDimSteps; ++ds) {
        uint32_t qf[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          ldmatrix_x4(qf[mt], q_tile + C::Ring::position(warp_row0 + mt * 16 + lane % 16,
                                                         2 * ds + lane / 16));
        }
#pragma unroll
        for (int kb = 0; kb < C::kKeyBlocks; ++kb) {
          uint32_t kf[4];
          const int key = key0 + kb * 16 + (lane / 16) * 8 + lane % 8;
          ldmatrix_x4(kf, ks + C::Ring::position(key, 2 * ds + (lane / 8) % 2));
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            mma_16816<T>(s[mt][2 * kb], qf[mt], kf[0], kf[1]);
            mma_16816<T>(s[mt][2 * kb + 1], qf[mt], kf[2], kf[3]);
          }
        }
      }

      if (masked) {
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mask_scores(s[mt], ring.mapped(i), key0, t0, limit[mt], lane);
        }
      }
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        float alpha[2];
        softmax_scores(s[mt], m[mt], d[mt], c, alpha);
        rescale_rows(o[mt], alpha);
      }

      // O += P V: each V fragment serves all kMTiles row tiles.
#pragma unroll
      for (int kb = 0; kb < C::kKeyBlocks; ++kb) {
        uint32_t a[kMTiles][4];
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) probabilities_fragment<T>(s[mt], kb, a[mt]);
#pragma unroll
        for (int ds = 0; ds < C::kDimSteps; ++ds) {
          uint32_t vf[4];
          const int key = key0 + kb * 16 + lane % 16;
          ldmatrix_x4_trans(vf, vs + C::Ring::position(key, 2 * ds + lane / 16));
#pragma unroll
          for (int mt = 0; mt < kMTiles; ++mt) {
            mma_16816<T>(o[mt][2 * ds], a[mt], vf[0], vf[1]);
            mma_16816<T>(o[mt][2 * ds + 1], a[mt], vf[2], vf[3]);
          }
        }
      }
    }  // pass
    pending_unmapped = ring.advance(p.kv, i, window);
  }
  cp_async_wait<0>();
  __syncthreads();  // Q and the ring are free from here on

  // Epilogue: every warp parks (m, d, O) in shared memory; then all threads merge the kWarpsKV
  // partial states of each row (one state when kWarpsKV == 1) and write 8 dims at a time.
  float* scratch = reinterpret_cast<float*>(smem);  // [kWarpsKV][kRows][kOutStride]
  float* stats = scratch + kWarpsKV * C::kRows * C::kOutStride;  // [kWarpsKV][kRows][2]
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    park_rows<kHeadDim / 8, C::kOutStride>(scratch, stats,
                                           warp_kv * C::kRows + warp_row0 + mt * 16, o[mt],
                                           m[mt], d[mt], lane);
  }
  __syncthreads();
  write_parked_rows<T, kHeadDim, C::kRows, kWarpsKV, C::kOutStride, C::kThreads>(
      p, w, row_begin, row_end, scratch, stats);
}

}  // namespace pagekernels::cuda
