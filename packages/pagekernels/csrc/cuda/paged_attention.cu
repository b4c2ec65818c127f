// pagekernels::cuda::paged_attention: attention over K/V pages named by block_table.
#include "cuda/attention_launch.cuh"
#include "cuda/launch.h"

namespace pagekernels::cuda {

void paged_attention(const mx::array& q, const mx::array& k_pages, const mx::array& v_pages,
                     const mx::array& block_table, const mx::array& context_lens, mx::array& out,
                     float scale, bool causal, const mx::Stream& s) {
  NvtxRange range("pagekernels::paged_attention");
  check_head_dim("paged_attention", q.shape(3));
  check_aligned("paged_attention", {&q, &k_pages, &v_pages});
  auto& enc = mx::cu::get_command_encoder(s);
  const int page_size = k_pages.shape(2);
  const AttentionShape shape{q.shape(0),
                             q.shape(1),
                             k_pages.shape(1),
                             q.shape(2),
                             q.shape(3),
                             int64_t{block_table.shape(1)} * page_size,
                             page_size,
                             scale,
                             causal};
  const PagedKV kv{PagedKVLayout{k_pages.shape(0), k_pages.shape(1), page_size, k_pages.shape(3),
                                 mx::gpu_ptr<int32_t>(block_table), block_table.shape(1)},
                   mx::gpu_ptr<int32_t>(context_lens)};
  dispatch_float(q.dtype(), "paged_attention", [&](auto tag) {
    using T = decltype(tag);
    launch_attention<T>(enc, q, k_pages, v_pages, {&block_table, &context_lens}, out, shape, kv);
  });
}

}  // namespace pagekernels::cuda
