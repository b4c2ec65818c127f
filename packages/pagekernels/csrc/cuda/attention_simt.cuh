// CUDA-core attention kernel (FlashInfer's batch-decode mapping): every dtype and head dim.
// Used for decode (L <= 8) when tensor cores do not apply (float32, D other than 64/128, or
// switched off in tuning.h), and for float32 prefill (correctness, not speed).
//
// Thread mapping, 128 threads = kLanes x kRows x kKeyGroups:
//   kLanes (tx)     lanes of one row; lane tx owns kVec contiguous dims (one 16-byte vector for
//                   16-bit types at D = 128), so a key row is one coalesced 256-byte read;
//   kRows (ty)      packed query rows of the CTA (G heads x L positions of one kv head), which
//                   all read the same K/V tile from shared memory: K/V leave HBM once per kv head;
//   kKeyGroups (tz) groups that take interleaved keys of each tile; each keeps its own (m, d, o)
//                   and they merge through shared memory at the end.
// K/V tiles of kTile keys stream through the cp.async ring of kv_ring.cuh (row offsets resolved
// once per key, block_table loads overlapped with compute). Rows past a request's keys and rows
// of unmapped pages are zero-filled and masked, so NaN garbage in the pool never reaches the
// output.
#pragma once

#include "cuda/attention_common.cuh"
#include "cuda/kv_ring.cuh"
#include "cuda/kv_source.cuh"

namespace pagekernels::cuda {

template <typename T, int kDimCap, int kRowsPerCta>
struct SimtConfig {
  static constexpr int kThreads = 128;
  static constexpr int kVec = (16 / int(sizeof(T))) > kDimCap / 32 ? 16 / int(sizeof(T))
                                                                     : kDimCap / 32;
  static constexpr int kLanes = kDimCap / kVec;
  static constexpr int kRows = kRowsPerCta;
  static_assert(kLanes <= 32 && kLanes * kRows <= kThreads, "row group must fit the CTA");
  static constexpr int kKeyGroups = kThreads / (kLanes * kRows);
  static constexpr int kBytesPerKey = 2 * kDimCap * int(sizeof(T));  // K and V
  // ~16 KB of K+V per stage, 4 stages: 48 KB in flight per CTA while one tile is computed.
  static constexpr int kTile = kKeyGroups > 16384 / kBytesPerKey ? kKeyGroups
                                                                 : 16384 / kBytesPerKey;
  static constexpr int kKeysPerThread = kTile / kKeyGroups;
  static constexpr int kStages = 4;
  static constexpr int kAhead = 4;  // block_table lookahead in tiles (kv_ring.cuh)
  using Ring = KVRing<T, kTile, kDimCap, kStages, kThreads, TileLayout::kPlain>;
  static constexpr size_t kSmemBytes = Ring::kSmemBytes;
  static_assert(kKeyGroups * kRows * (kDimCap + 2) * sizeof(float) <= Ring::kRingBytes,
                "merge scratch reuses the K/V ring");
};

template <typename T, int kDimCap, int kRowsPerCta, typename KV>
__global__ void __launch_bounds__(128)
    attention_simt_kernel(const __grid_constant__ AttentionParams<T, KV> p) {
  using C = SimtConfig<T, kDimCap, kRowsPerCta>;
  constexpr int kStages = C::kStages;
  constexpr int kVec = C::kVec;
  extern __shared__ __align__(128) unsigned char smem[];

  const int tid = threadIdx.x;
  const int tx = tid % C::kLanes;
  const int ty = (tid / C::kLanes) % C::kRows;
  const int tz = tid / (C::kLanes * C::kRows);
  const CtaRows cta = cta_rows(p, C::kRows, work_item(p));
  const auto& [w, num_keys, row_begin, row_end, range] = cta;
  const typename C::Ring ring(smem, p.k, p.v, w.b, w.kv_head, range.begin, range.end,
                              p.head_dim);
  const int r = row_begin + ty;
  const bool row_valid = r < row_end;
  const int d0 = tx * kVec;
  const bool dims_valid = d0 < p.head_dim;
  const int limit = cta.limit(p, r);

  // Queries in fp32, pre-scaled by scale * log2(e) (never rounded back to T).
  float q[kVec] = {};
  if (row_valid && dims_valid) {
    load_float(p.q + q_row_offset(p, w.b, w.kv_head, r) + d0, q);
#pragma unroll
    for (int e = 0; e < kVec; ++e) q[e] *= p.scale_log2;
  }

  float o[kVec] = {};
  SoftmaxState state = SoftmaxState::empty();

  KVRow window[C::kAhead];
  ring.start(p.kv, window);
  __syncthreads();
  for (int s = 0; s < kStages - 1; ++s) ring.issue(s);

  for (int i = 0; i < ring.num_tiles; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    ring.issue(i + kStages - 1);

    const T* ks = ring.k_tile(i);
    const T* vs = ring.v_tile(i);
    const int64_t* offs = ring.tile_offsets(i);
    const int t0 = ring.first_key(i);
    float s[C::kKeysPerThread];
    float tile_max = -INFINITY;
#pragma unroll
    for (int kk = 0; kk < C::kKeysPerThread; ++kk) {
      const int j = kk * C::kKeyGroups + tz;
      float kf[kVec];
      load_float(ks + j * kDimCap + d0, kf);
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < kVec; ++e) dot = fmaf(q[e], kf[e], dot);
      dot = group_sum<C::kLanes>(dot);
      s[kk] = (t0 + j < limit && offs[j] >= 0) ? dot : -INFINITY;
      tile_max = fmaxf(tile_max, s[kk]);
    }
    if (tile_max > -INFINITY) {
      const float m_new = fmaxf(state.m, tile_max);
      const float alpha = fast_exp2(state.m - m_new);  // 0 while state.m == -inf
      state.m = m_new;
      state.d *= alpha;
#pragma unroll
      for (int e = 0; e < kVec; ++e) o[e] *= alpha;
#pragma unroll
      for (int kk = 0; kk < C::kKeysPerThread; ++kk) {
        const float pk = fast_exp2(s[kk] - m_new);
        float vf[kVec];
        load_float(vs + (kk * C::kKeyGroups + tz) * kDimCap + d0, vf);
        state.d += pk;
#pragma unroll
        for (int e = 0; e < kVec; ++e) o[e] = fmaf(pk, vf[e], o[e]);
      }
    }
    ring.advance(p.kv, i, window);
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free from here on

  if constexpr (C::kKeyGroups > 1) {
    float* partial_o = reinterpret_cast<float*>(smem);  // [kKeyGroups][kRows][kDimCap]
    float* partial_md = partial_o + C::kKeyGroups * C::kRows * kDimCap;  // [..][..][2]
    const int slot = tz * C::kRows + ty;
#pragma unroll
    for (int e = 0; e < kVec; e += 4) {
      *reinterpret_cast<float4*>(partial_o + slot * kDimCap + d0 + e) =
          make_float4(o[e], o[e + 1], o[e + 2], o[e + 3]);
    }
    if (tx == 0) {
      partial_md[2 * slot] = state.m;
      partial_md[2 * slot + 1] = state.d;
    }
    __syncthreads();
    if (tz != 0) return;
    for (int z = 1; z < C::kKeyGroups; ++z) {
      const int other = z * C::kRows + ty;
      const SoftmaxState b{partial_md[2 * other], partial_md[2 * other + 1]};
      const MergeFactors f = merge_states(state, b);
      const float* ob = partial_o + other * kDimCap + d0;
#pragma unroll
      for (int e = 0; e < kVec; ++e) o[e] = o[e] * f.fa + ob[e] * f.fb;
    }
  }
  if (row_valid && dims_valid) write_row<T>(p, w, r, d0, o, state);
}

}  // namespace pagekernels::cuda
