// Split-K (flash-decoding) planner for the attention kernels. Host code, no CUDA.
//
// MLX records every launch into a CUDA graph and eval_gpu must not read device values, so the
// plan depends on SHAPES only: the key bound max_keys (max_pages * page_size, or S for dense),
// the number of CTAs without a split, and how many CTAs fit on the GPU at once. A split whose
// chunk lies past a row's real context writes an empty state (o = 0, lse = -inf) that the merge
// kernel ignores.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>

namespace pagekernels::cuda {

// A chunk shorter than this costs more in launch/merge than it gains in parallelism. 256 keys
// (128 KB of bf16 K+V per kv head at D=128) as FlashInfer's single-request decode; to tune.
constexpr int kMinChunkKeys = 256;

constexpr int kMaxSplits = 65535;  // gridDim.y

// Most chunks the decode planner picks by itself. Past 8 chunks per row the merge (which walks
// a row's chunks) costs more than the extra CTAs gain: on the H200 (operator benchmark, bf16,
// Hkv 8) B=1 x 8192 took 22.9 us in 32 chunks and 18.6 us in 8, B=1 x 32768 43.6 us in 64 and
// 39.1 us in 8, with 16 and 64 chunks slower than 8 at both page sizes; at the other B = 1
// and 8 shapes measured the planner already chose at most 8.
constexpr int kMaxAutoDecodeSplits = 8;

// CTAs the decode planner splits for: half as many as SMs, tuned on the H200 for the decode mma
// kernel (operator benchmark, bf16, Hkv 8, D 128, page 16; results/h200/session9/94750e8-tma),
// where 64 unsplit CTAs already stream K/V at 4.3 TB/s (B = 8 x 8192: 62.5 us unsplit, 61.9 in 2
// chunks, 71.1 in the 8 that a target of two waves of CTA slots chose), and every split adds the
// merge (B = 8 x 1024: 14.1 us unsplit, 18.9 in 4 chunks; B = 32 x 1024: 37.2 vs 41.8 in 2; B = 32
// x 8192: 244.0 vs 251.5 in 2). B = 1 (8 CTAs unsplit) still takes 8 chunks.
inline int64_t decode_target_ctas(int sm_count) { return std::max(sm_count / 2, 1); }

struct SplitPlan {
  int num_splits;  // key chunks per (b, kv_head, row block)
  int chunk_keys;  // keys per chunk, a multiple of `align`
};

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// work: CTAs without a split; max_keys: most keys any row can see (shape bound); align: chunk
// granularity (lcm of page size and key tile); target_ctas: split until work * splits reaches
// this many CTAs (decode_target_ctas for decode, one wave of resident CTAs for prefill);
// max_auto_splits: most chunks chosen that way; forced_splits: 0 = choose, n > 0 = n chunks
// (tests, benchmarks), clamped to what fits.
inline SplitPlan plan_splits(int64_t work, int64_t max_keys, int align, int64_t target_ctas,
                             int max_auto_splits, int forced_splits) {
  max_keys = std::max<int64_t>(max_keys, 1);
  work = std::max<int64_t>(work, 1);
  const int64_t most = std::min<int64_t>(ceil_div(max_keys, align), kMaxSplits);
  int64_t splits = 1;
  if (forced_splits > 0) {
    splits = forced_splits;
  } else if (work < target_ctas) {
    const int64_t to_fill = target_ctas / work;
    const int64_t by_chunk = max_keys / kMinChunkKeys;
    splits = std::min({to_fill, by_chunk, int64_t{max_auto_splits}});
  }
  splits = std::clamp<int64_t>(splits, 1, most);
  const int64_t chunk = ceil_div(ceil_div(max_keys, splits), align) * align;
  return {static_cast<int>(ceil_div(max_keys, chunk)), static_cast<int>(chunk)};
}

// Chunk granularity: whole key tiles, and whole pages so a chunk never starts mid-page.
inline int chunk_alignment(int page_size, int key_tile) {
  const int64_t a = std::lcm<int64_t>(page_size, key_tile);
  return static_cast<int>(std::min<int64_t>(a, int64_t{1} << 20));
}

}  // namespace pagekernels::cuda
