// GatherKV::eval_cpu: copy each request's pages into dense [B, Hkv, max_pages * ps, D] K/V, with
// zeros past its context (and for padding or invalid page ids).
#include <algorithm>

#include "cpu/dispatch.h"
#include "kernels/paged_kv.h"
#include "primitives.h"

namespace pagekernels {

void GatherKV::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  if (!cpu::allocate_outputs(outputs)) return;
  const auto& key_pages = inputs[0];
  const auto& block_table = inputs[2];
  const auto& context_lens = inputs[3];
  auto& enc = cpu::encoder_for(stream(), inputs, outputs);

  const PagedKVLayout layout{key_pages.shape(0), key_pages.shape(1), key_pages.shape(2),
                             key_pages.shape(3), block_table.data<int32_t>(),
                             block_table.shape(1)};
  const int batch = block_table.shape(0);
  cpu::dispatch_float(key_pages.dtype(), name(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    enc.dispatch([layout, batch, key_pages = key_pages.data<T>(),
                  value_pages = inputs[1].data<T>(), lens = context_lens.data<int32_t>(),
                  keys = outputs[0].data<T>(), values = outputs[1].data<T>()] {
      const int ps = layout.page_size;
      const int64_t page_elems = static_cast<int64_t>(ps) * layout.head_dim;
      const T zero = cpu::from_float<T>(0.0f);
      for (int b = 0; b < batch; ++b) {
        for (int h = 0; h < layout.num_kv_heads; ++h) {
          for (int lp = 0; lp < layout.max_pages; ++lp) {
            const int64_t dst =
                ((static_cast<int64_t>(b) * layout.num_kv_heads + h) * layout.max_pages + lp) *
                page_elems;
            const int32_t page = layout.page_id(b, lp);
            const int live = page < 0 ? 0 : std::clamp(lens[b] - lp * ps, 0, ps);
            const int64_t live_elems = static_cast<int64_t>(live) * layout.head_dim;
            if (live > 0) {
              const int64_t src = layout.offset(page, h, 0);
              std::copy_n(key_pages + src, live_elems, keys + dst);
              std::copy_n(value_pages + src, live_elems, values + dst);
            }
            std::fill_n(keys + dst + live_elems, page_elems - live_elems, zero);
            std::fill_n(values + dst + live_elems, page_elems - live_elems, zero);
          }
        }
      }
    });
  });
}

}  // namespace pagekernels
