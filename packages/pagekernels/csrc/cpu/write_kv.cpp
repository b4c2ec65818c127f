// WriteKV::eval_cpu: copy each new token's K/V rows into its slot of the page storage, in place.
#include <algorithm>

#include "cpu/dispatch.h"
#include "kernels/paged_kv.h"
#include "primitives.h"

namespace pagekernels {

void WriteKV::eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  // The outputs ARE the page buffers (see WriteKV): no allocation, no copy of the pool.
  outputs[0].copy_shared_buffer(inputs[0]);
  outputs[1].copy_shared_buffer(inputs[1]);
  const auto& keys = inputs[2];
  const auto& values = inputs[3];
  const auto& slot_mapping = inputs[4];
  if (keys.size() == 0) return;
  auto& enc = cpu::encoder_for(stream(), inputs, outputs);

  const int num_tokens = keys.shape(0);
  const int num_kv_heads = keys.shape(1);
  const int head_dim = keys.shape(2);
  const int page_size = inputs[0].shape(2);
  const int64_t num_slots = static_cast<int64_t>(inputs[0].shape(0)) * page_size;
  cpu::dispatch_float(keys.dtype(), name(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    enc.dispatch([key_pages = outputs[0].data<T>(), value_pages = outputs[1].data<T>(),
                  new_keys = keys.data<T>(), new_values = values.data<T>(),
                  slots = slot_mapping.data<int32_t>(), num_tokens, num_kv_heads, head_dim,
                  page_size, num_slots] {
      for (int t = 0; t < num_tokens; ++t) {
        const int64_t slot = slots[t];
        if (slot < 0 || slot >= num_slots) continue;  // padding, or never outside storage
        for (int h = 0; h < num_kv_heads; ++h) {
          const int64_t src = (static_cast<int64_t>(t) * num_kv_heads + h) * head_dim;
          const int64_t dst = slot_offset(slot, page_size, num_kv_heads, h, head_dim);
          std::copy_n(new_keys + src, head_dim, key_pages + dst);
          std::copy_n(new_values + src, head_dim, value_pages + dst);
        }
      }
    });
  });
}

}  // namespace pagekernels
