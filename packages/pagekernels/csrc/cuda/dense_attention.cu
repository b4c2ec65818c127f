// pagekernels::cuda::dense_attention: the same attention kernels over dense [B, Hkv, S, D] K/V
// (the seed's Week 2 baseline); only the addressing policy (DenseKV) differs from paged.
#include "cuda/attention_launch.cuh"
#include "cuda/launch.h"

namespace pagekernels::cuda {

void dense_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                     const mx::array& key_lens, mx::array& out, float scale, bool causal,
                     const mx::Stream& s) {
  NvtxRange range("pagekernels::dense_attention");
  check_head_dim("dense_attention", q.shape(3));
  check_aligned("dense_attention", {&q, &k, &v});
  auto& enc = mx::cu::get_command_encoder(s);
  const AttentionShape shape{q.shape(0), q.shape(1), k.shape(1), q.shape(2), q.shape(3),
                             k.shape(2), /*page_size=*/1,      scale,      causal};
  const DenseKV kv{k.shape(1), k.shape(2), k.shape(3), mx::gpu_ptr<int32_t>(key_lens)};
  dispatch_float(q.dtype(), "dense_attention", [&](auto tag) {
    using T = decltype(tag);
    launch_attention<T>(enc, q, k, v, {&key_lens}, out, shape, kv);
  });
}

}  // namespace pagekernels::cuda
