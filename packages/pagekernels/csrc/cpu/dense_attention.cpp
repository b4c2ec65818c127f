// DenseAttention::eval_cpu: the shared attention kernel with dense [B, Hkv, S, D] addressing.
#include "cpu/attention.h"
#include "cpu/dispatch.h"
#include "primitives.h"

namespace pagekernels {

void DenseAttention::eval_cpu(const std::vector<mx::array>& inputs,
                              std::vector<mx::array>& outputs) {
  if (!cpu::allocate_outputs(outputs)) return;
  const auto& q = inputs[0];
  const auto& k = inputs[1];
  const auto& v = inputs[2];
  const auto& key_lens = inputs[3];
  auto& out = outputs[0];
  auto& enc = cpu::encoder_for(stream(), inputs, outputs);

  const cpu::AttentionShape shape{q.shape(0), q.shape(1), k.shape(1), q.shape(2),
                                  q.shape(3), scale_, causal_};
  cpu::dispatch_float(q.dtype(), name(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const cpu::DenseKeys<T> keys{k.data<T>(), v.data<T>(), k.shape(1), k.shape(2), k.shape(3),
                                 key_lens.data<int32_t>()};
    enc.dispatch([shape, keys, q_ptr = q.data<T>(), out_ptr = out.data<T>()] {
      cpu::attention(shape, keys, q_ptr, out_ptr);
    });
  });
}

}  // namespace pagekernels
