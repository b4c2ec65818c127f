// Host side shared by paged_attention.cu and dense_attention.cu: choose the schedule and kernel,
// plan the split from shapes, and add the attention (+ merge) nodes to MLX's graph.
//
// Schedules: decode (L <= kDecodeMaxQueryLen) and prefill. Kernels:
//   float16/bfloat16, D in {64, 128}: attention_wgmma for prefill tiles of 128 rows at D = 128
//     on sm_90, attention_mma otherwise (decode or prefill warp layout);
//   everything else (float32, other D): attention_simt, D rounded up to 64/128/256.
#pragma once

#include <algorithm>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

#include "cuda/attention_mma.cuh"
#include "cuda/attention_simt.cuh"
#include "cuda/attention_wgmma.cuh"
#include "cuda/launch_utils.cuh"
#include "cuda/merge_splits.cuh"
#include "cuda/split_plan.h"
#include "cuda/tuning.h"
#include "kernels/gpu_limits.h"

namespace pagekernels::cuda {

// Query lengths up to this use the decode schedule (same constant as the CPU kernels; the
// seed's starting value, to confirm by measuring L = 8 vs 9 on the H200).
constexpr int kDecodeMaxQueryLen = 8;

struct AttentionShape {
  int batch;         // B
  int num_q_heads;   // Hq
  int num_kv_heads;  // Hkv
  int query_len;     // L
  int head_dim;      // D
  int64_t max_keys;  // shape bound on keys per request: max_pages * page_size, or S
  int page_size;     // split chunks start on page boundaries (dense: 1)
  float scale;
  bool causal;
};

template <typename T, typename KV>
struct KernelChoice {
  void (*kernel)(AttentionParams<T, KV>);
  int threads;
  size_t smem_bytes;
  int rows_per_cta;
  int key_tile;
  bool persistent = false;  // one CTA per SM walks the work items (PersistentSchedule)
};

template <typename T, int kDimCap, int kRows, typename KV>
KernelChoice<T, KV> simt_choice() {
  using C = SimtConfig<T, kDimCap, kRows>;
  return {&attention_simt_kernel<T, kDimCap, kRows, KV>, C::kThreads, C::kSmemBytes, kRows,
          C::kTile};
}

// Rows per CTA: 1 (MHA decode), 4 or 8 (as many as the 128 threads allow at this D).
template <typename T, int kDimCap, typename KV>
KernelChoice<T, KV> simt_choice_for_rows(int rows) {
  if (rows <= 1) return simt_choice<T, kDimCap, 1, KV>();
  if constexpr (SimtConfig<T, kDimCap, 1>::kLanes * 8 <= 128) {
    if (rows > 4) return simt_choice<T, kDimCap, 8, KV>();
  }
  return simt_choice<T, kDimCap, 4, KV>();
}

template <typename T, typename KV>
KernelChoice<T, KV> simt_kernel(int head_dim, int rows) {
  if (head_dim <= 64) return simt_choice_for_rows<T, 64, KV>(rows);
  if (head_dim <= 128) return simt_choice_for_rows<T, 128, KV>(rows);
  return simt_choice_for_rows<T, kGpuMaxHeadDim, KV>(rows);
}

template <typename T, int kHeadDim, int kWarpsQ, int kWarpsKV, int kMTiles, int kStages,
          typename KV>
KernelChoice<T, KV> mma_choice() {
  using C = MmaConfig<T, kHeadDim, kWarpsQ, kWarpsKV, kMTiles, kStages>;
  return {&attention_mma_kernel<T, kHeadDim, kWarpsQ, kWarpsKV, kMTiles, kStages, KV>,
          C::kThreads, C::kSmemBytes, C::kRows, C::kTile};
}

enum class MmaLayout {
  kDecode,       // 16 rows, 4 warps split the keys, 3-stage ring (~100 KB at D=128: 2 CTAs/SM)
  kPrefill64,    // 64 rows, 4 warps x 16 rows, 2-stage ring (~82 KB: 2 CTAs/SM)
  kPrefill128,   // 128 rows, 4 warps x 32 rows, 2-stage ring (~98 KB: 2 CTAs/SM)
};

template <typename T, int kHeadDim, typename KV>
KernelChoice<T, KV> mma_choice_for(MmaLayout layout) {
  switch (layout) {
    case MmaLayout::kDecode:
      return mma_choice<T, kHeadDim, 1, 4, 1, 3, KV>();
    case MmaLayout::kPrefill64:
      return mma_choice<T, kHeadDim, 4, 1, 1, 2, KV>();
    default:
      return mma_choice<T, kHeadDim, 4, 1, 2, 2, KV>();
  }
}

template <typename T, typename KV>
KernelChoice<T, KV> mma_kernel(int head_dim, MmaLayout layout) {
  return head_dim == 64 ? mma_choice_for<T, 64, KV>(layout) : mma_choice_for<T, 128, KV>(layout);
}

// Warp-specialised and persistent, 128-key tiles, 3 stages (230,592 B of shared memory).
template <typename T, typename KV>
KernelChoice<T, KV> wgmma_kernel() {
  using C = WgmmaConfig<T, 3>;
  return {&attention_wgmma_kernel<T, 3, KV>, C::kThreads, C::kSmemBytes, C::kRows, C::kTile,
          true};
}

// 128-row prefill tiles use every K/V fragment for twice the rows (measured 1.2x faster than 64
// rows at L = 1024 and 4096 on the H200); 64-row tiles waste less on short chunks.
inline MmaLayout prefill_layout(int rows) {
  return rows > 64 ? MmaLayout::kPrefill128 : MmaLayout::kPrefill64;
}

// The op functions reject these head dims for GPU streams (ops/checks.h); this guards eval_gpu.
inline void check_head_dim(std::string_view op, int head_dim) {
  if (!gpu_supports_head_dim(head_dim)) {
    throw std::invalid_argument("[" + std::string(op) +
                                "] the CUDA kernels support head dims that are multiples of 8 "
                                "up to " + std::to_string(kGpuMaxHeadDim) +
                                ", got D=" + std::to_string(head_dim));
  }
}

// Rows per TMA box in attention_wgmma: the largest power of two up to 32 that divides the
// run of keys the storage keeps in consecutive rows (a page; dense: all of a request's keys), 0
// when that is under 8 rows (a box must fill whole 1024-byte swizzle atoms).
inline int tma_box_rows(const PagedKV& kv) {
  const int pow2 = kv.layout.page_size & -kv.layout.page_size;
  return pow2 >= 8 ? std::min(pow2, 32) : 0;
}
inline int tma_box_rows(const DenseKV&) { return 32; }

// Allocates `out` and adds the nodes computing attention of q over the keys that `kv` addresses
// in k/v. `metadata` are the small int32 inputs (block_table, lens) the kernels read.
template <typename T, typename KV>
void launch_attention(Encoder& enc, const mx::array& q, const mx::array& k, const mx::array& v,
                      std::initializer_list<const mx::array*> metadata, mx::array& out,
                      const AttentionShape& s, const KV& kv) {
  const bool decode = s.query_len <= kDecodeMaxQueryLen;
  const int group = s.num_q_heads / s.num_kv_heads;
  const int rows = s.query_len * group;
  bool tensor_cores = false;
  if constexpr (!std::is_same_v<T, float>) {
    tensor_cores = (s.head_dim == 64 || s.head_dim == 128) && (!decode || decode_tensor_cores());
  }
  KernelChoice<T, KV> choice{};
  if constexpr (!std::is_same_v<T, float>) {
    if (tensor_cores) {
      const MmaLayout layout = decode ? MmaLayout::kDecode : prefill_layout(rows);
      // 128-row prefill tiles at D = 128 on sm_90 run on wgmma (1.65x faster than mma.sync at
      // L = 4096, 1.4x at 1024 in session 8: docs/performance.md) unless the prefill_kernel knob
      // says mma_sync. D = 64 stays on mma.sync: its wgmma variant went wrong past the first tile.
      const bool wgmma = layout == MmaLayout::kPrefill128 && s.head_dim == 128 &&
                         prefill_kernel() != PrefillKernel::kMmaSync && is_sm90(enc);
      choice = wgmma ? wgmma_kernel<T, KV>() : mma_kernel<T, KV>(s.head_dim, layout);
    }
  }
  if (!tensor_cores) choice = simt_kernel<T, KV>(s.head_dim, rows);
  const KernelInfo info = kernel_info(enc, reinterpret_cast<const void*>(choice.kernel),
                                      choice.threads, choice.smem_bytes);

  const int row_blocks = static_cast<int>(ceil_div(rows, choice.rows_per_cta));
  const int64_t work = int64_t{s.batch} * s.num_kv_heads * row_blocks;
  const int64_t wave = int64_t{sm_count(enc)} * info.ctas_per_sm;
  // Both split only to fill one wave; prefill partials cost rows * splits * D * 8 bytes of
  // traffic, so its chunks stay longer.
  const SplitPlan plan =
      plan_splits(work, s.max_keys, chunk_alignment(s.page_size, choice.key_tile), wave,
                  decode ? kMinDecodeChunkKeys : kMinChunkKeys,
                  decode ? kMaxAutoDecodeSplits : kMaxSplits,
                  decode ? decode_num_splits() : prefill_num_splits());

  out.set_data(mx::allocator::malloc(out.nbytes()));
  AttentionParams<T, KV> p{};
  p.q = mx::gpu_ptr<T>(q);
  p.k = mx::gpu_ptr<T>(k);
  p.v = mx::gpu_ptr<T>(v);
  p.out = mx::gpu_ptr<T>(out);
  p.kv = kv;
  p.batch = s.batch;
  p.num_q_heads = s.num_q_heads;
  p.num_kv_heads = s.num_kv_heads;
  p.group = Divisor::of(group);
  p.query_len = s.query_len;
  p.head_dim = s.head_dim;
  p.num_row_blocks = row_blocks;
  p.num_splits = plan.num_splits;
  p.chunk_keys = plan.chunk_keys;
  p.scale_log2 = s.scale * kLog2e;
  p.causal = s.causal;
  if constexpr (!std::is_same_v<T, float>) {
    // The wgmma kernel bulk-copies runs of consecutive K/V rows (row = element offset / D).
    const int64_t storage_rows = static_cast<int64_t>(k.size()) / s.head_dim;
    const int box_rows = tma_box_rows(kv);
    const bool fits = storage_rows >= box_rows &&
                      storage_rows <= std::numeric_limits<int32_t>::max();  // int row coordinates
    if (choice.persistent && box_rows > 0 && fits) {  // persistent: the wgmma kernel (D = 128)
      p.tma.k = rows_tensor_map<T>(p.k, storage_rows, s.head_dim, box_rows);
      p.tma.v = rows_tensor_map<T>(p.v, storage_rows, s.head_dim, box_rows);
      p.tma.box_rows = box_rows;
    }
  }

  auto register_inputs = [&] {
    enc.set_input_array(q);
    enc.set_input_array(k);
    enc.set_input_array(v);
    for (const mx::array* a : metadata) enc.set_input_array(*a);
  };
  const int64_t items = work * plan.num_splits;
  const dim3 grid = choice.persistent
                        ? dim3(static_cast<unsigned>(std::min(items, wave)))
                        : dim3(static_cast<unsigned>(work), static_cast<unsigned>(plan.num_splits));
  if (plan.num_splits == 1) {
    register_inputs();
    enc.set_output_array(out);
    add_kernel(enc, info, grid, choice.threads, choice.smem_bytes, p);
    return;
  }

  const int64_t out_rows = int64_t{s.batch} * s.num_q_heads * s.query_len;
  mx::array partial_out = scratch_array(
      enc, {static_cast<int>(out_rows), plan.num_splits, s.head_dim}, mx::float32);
  mx::array partial_lse =
      scratch_array(enc, {static_cast<int>(out_rows), plan.num_splits}, mx::float32);
  p.partial_out = mx::gpu_ptr<float>(partial_out);
  p.partial_lse = mx::gpu_ptr<float>(partial_lse);
  register_inputs();
  enc.set_output_array(partial_out);
  enc.set_output_array(partial_lse);
  add_kernel(enc, info, grid, choice.threads, choice.smem_bytes, p);

  const KernelInfo merge = kernel_info(
      enc, reinterpret_cast<const void*>(&merge_splits_kernel<T>), 32 * kMergeWarps, 0);
  const float* merge_in = p.partial_out;
  const float* merge_lse = p.partial_lse;
  T* merge_out = p.out;
  int num_splits = plan.num_splits;
  int head_dim = s.head_dim;
  int64_t num_rows = out_rows;
  enc.set_input_array(partial_out);
  enc.set_input_array(partial_lse);
  enc.set_output_array(out);
  add_kernel(enc, merge, dim3(static_cast<unsigned>(ceil_div(out_rows, kMergeWarps))),
             32 * kMergeWarps, 0, merge_in, merge_lse, merge_out, num_rows, num_splits, head_dim);
}

}  // namespace pagekernels::cuda
