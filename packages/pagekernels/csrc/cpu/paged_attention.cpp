// PagedAttention::eval_cpu: the shared attention kernel with paged addressing.
#include "cpu/attention.h"
#include "cpu/dispatch.h"
#include "primitives.h"

namespace pagekernels {

void PagedAttention::eval_cpu(const std::vector<mx::array>& inputs,
                              std::vector<mx::array>& outputs) {
  if (!cpu::allocate_outputs(outputs)) return;
  const auto& q = inputs[0];
  const auto& key_pages = inputs[1];
  const auto& value_pages = inputs[2];
  const auto& block_table = inputs[3];
  const auto& context_lens = inputs[4];
  auto& out = outputs[0];
  auto& enc = cpu::encoder_for(stream(), inputs, outputs);

  const cpu::AttentionShape shape{q.shape(0), q.shape(1), key_pages.shape(1), q.shape(2),
                                  q.shape(3), scale_, causal_};
  const PagedKVLayout layout{key_pages.shape(0), key_pages.shape(1), key_pages.shape(2),
                             key_pages.shape(3), block_table.data<int32_t>(),
                             block_table.shape(1)};
  cpu::dispatch_float(q.dtype(), name(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const cpu::PagedKeys<T> keys{key_pages.data<T>(), value_pages.data<T>(), layout,
                                 context_lens.data<int32_t>()};
    enc.dispatch([shape, keys, q_ptr = q.data<T>(), out_ptr = out.data<T>()] {
      cpu::attention(shape, keys, q_ptr, out_ptr);
    });
  });
}

}  // namespace pagekernels
