// pagekernels::cuda::decode_qkv: a decode step's (L = 1) queries, keys and values from the qkv
// projection in one launch: q_norm + RoPE of the query heads into queries [B, Hq, 1, D],
// k_norm + RoPE of the key heads straight into their page slots, and the value heads copied
// into theirs. Replaces norm_rope(q), norm_rope(k) and write_kv inside the decoder layer: two
// launches fewer per layer, and the keys never make a round trip through memory.
//
// Mapping: one warp per (b, head) row of qkv [B, (Hq + 2 Hkv) * D] (q heads, then k, then v),
// the norm_rope row math of norm_rope_row.cuh. A token whose slot is negative or past the pages
// (a padding row of a bucketed batch) writes no K/V, as write_kv skips it.
#include "cuda/device_utils.cuh"
#include "cuda/launch.h"
#include "cuda/launch_utils.cuh"
#include "cuda/norm_rope_row.cuh"
#include "kernels/paged_kv.h"

namespace pagekernels::cuda {

namespace {

constexpr int kWarps = 4;  // rows per CTA
constexpr int kThreads = 32 * kWarps;

struct PageSlots {
  const int32_t* slots;  // [B]
  int64_t num_slots;     // P * page_size
  int page_size;
  int num_kv_heads;
};

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kThreads)
    decode_qkv_kernel(const T* qkv, const T* q_norm, const T* k_norm, const int32_t* offsets,
                      PageSlots pages, T* queries, T* key_pages, T* value_pages, int num_q_heads,
                      int64_t rows, float eps, Frequencies freqs) {
  constexpr bool kVector = is_power_of_two(kHeadDim / 64);
  __shared__ float inv_freq[kHeadDim / 2];
  load_frequencies<kHeadDim>(freqs, inv_freq);

  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps: every lane of a warp has the same row
  const int heads = num_q_heads + 2 * pages.num_kv_heads;
  const int64_t b = row / heads;
  const int head = static_cast<int>(row % heads);
  const T* src = qkv + row * kHeadDim;
  const float position = static_cast<float>(offsets[b]);
  if (head < num_q_heads) {
    norm_rope_row<T, kHeadDim, kVector>(src, 1, q_norm, position, inv_freq, eps,
                                        queries + (b * num_q_heads + head) * kHeadDim);
    return;
  }
  const int32_t slot = pages.slots[b];
  if (slot < 0 || slot >= pages.num_slots) return;
  const int kv_head = (head - num_q_heads) % pages.num_kv_heads;
  const int64_t offset =
      slot_offset(slot, pages.page_size, pages.num_kv_heads, kv_head, kHeadDim);
  if (head < num_q_heads + pages.num_kv_heads) {
    norm_rope_row<T, kHeadDim, kVector>(src, 1, k_norm, position, inv_freq, eps,
                                        key_pages + offset);
  } else {
    for (int i = threadIdx.x % 32; i < kHeadDim; i += 32) value_pages[offset + i] = src[i];
  }
}

}  // namespace

void decode_qkv(const mx::array& qkv, const mx::array& q_norm, const mx::array& k_norm,
                const mx::array& offsets, const mx::array& slot_mapping,
                const mx::array& key_pages, const mx::array& value_pages, mx::array& queries,
                mx::array& k_out, mx::array& v_out, float eps, const float* inv_freqs,
                const mx::Stream& s) {
  NvtxRange range("pagekernels::decode_qkv");
  const int head_dim = key_pages.shape(3);
  Frequencies freqs = frequencies("decoder_layer", inv_freqs, head_dim);
  auto& enc = mx::cu::get_command_encoder(s);
  queries.set_data(mx::allocator::malloc(queries.nbytes()));
  k_out.copy_shared_buffer(key_pages);
  v_out.copy_shared_buffer(value_pages);
  for (const mx::array* a :
       {&qkv, &q_norm, &k_norm, &offsets, &slot_mapping, &key_pages, &value_pages}) {
    enc.set_input_array(*a);
  }
  enc.set_output_array(queries);
  enc.set_output_array(k_out);
  enc.set_output_array(v_out);

  int num_q_heads = queries.shape(1);
  const int num_kv_heads = key_pages.shape(1);
  const int page_size = key_pages.shape(2);
  PageSlots pages{mx::gpu_ptr<int32_t>(slot_mapping), int64_t{key_pages.shape(0)} * page_size,
                  page_size, num_kv_heads};
  int64_t rows = int64_t{qkv.shape(0)} * (num_q_heads + 2 * num_kv_heads);
  const dim3 grid(static_cast<unsigned>((rows + kWarps - 1) / kWarps));
  dispatch_float(qkv.dtype(), "decoder_layer", [&](auto tag) {
    using T = decltype(tag);
    const T* xs = mx::gpu_ptr<T>(qkv);
    const T* qn = mx::gpu_ptr<T>(q_norm);
    const T* kn = mx::gpu_ptr<T>(k_norm);
    const int32_t* positions = mx::gpu_ptr<int32_t>(offsets);
    T* qs = mx::gpu_ptr<T>(queries);
    T* ks = mx::gpu_ptr<T>(k_out);
    T* vs = mx::gpu_ptr<T>(v_out);
    dispatch_head_dim(head_dim, [&](auto dim) {
      const KernelInfo info = kernel_info(
          enc, reinterpret_cast<const void*>(&decode_qkv_kernel<T, decltype(dim)::value>),
          kThreads, 0);
      add_kernel(enc, info, grid, kThreads, 0, xs, qn, kn, positions, pages, qs, ks, vs,
                 num_q_heads, rows, eps, freqs);
    });
  });
}

}  // namespace pagekernels::cuda
