// QuantizedEmbedding::eval_cpu: dequantize the selected rows of an mx.quantize'd (affine) table.
// Packing (all bit widths): row values form a little-endian bit stream, value i at bit i * bits;
// value = q * scale + bias per group of group_size values. Out-of-range indices give zero rows.
#include <algorithm>
#include <cstdint>

#include "cpu/dispatch.h"
#include "primitives.h"

namespace pagekernels {

void QuantizedEmbedding::eval_cpu(const std::vector<mx::array>& inputs,
                                  std::vector<mx::array>& outputs) {
  if (!cpu::allocate_outputs(outputs)) return;
  const auto& indices = inputs[0];
  const auto& weight = inputs[1];
  const auto& scales = inputs[2];
  const auto& biases = inputs[3];
  auto& out = outputs[0];
  auto& enc = cpu::encoder_for(stream(), inputs, outputs);

  const int num_indices = indices.shape(0);
  const int num_rows = weight.shape(0);
  const int64_t row_bytes = static_cast<int64_t>(weight.shape(1)) * 4;
  const int dims = out.shape(1);
  const int groups = scales.shape(1);
  cpu::dispatch_float(scales.dtype(), name(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    enc.dispatch([idx = indices.data<int32_t>(),
                  packed = reinterpret_cast<const uint8_t*>(weight.data<uint32_t>()),
                  scale = scales.data<T>(), bias = biases.data<T>(), rows = out.data<T>(),
                  num_indices, num_rows, row_bytes, dims, groups, group_size = group_size_,
                  bits = bits_] {
      const uint32_t mask = (1u << bits) - 1u;
      for (int n = 0; n < num_indices; ++n) {
        T* row = rows + static_cast<int64_t>(n) * dims;
        const int r = idx[n];
        if (r < 0 || r >= num_rows) {
          std::fill_n(row, dims, cpu::from_float<T>(0.0f));
          continue;
        }
        const uint8_t* bytes = packed + r * row_bytes;
        for (int g = 0; g < groups; ++g) {
          const float s = cpu::to_float(scale[static_cast<int64_t>(r) * groups + g]);
          const float b = cpu::to_float(bias[static_cast<int64_t>(r) * groups + g]);
          for (int i = g * group_size; i < (g + 1) * group_size; ++i) {
            const int64_t bit = static_cast<int64_t>(i) * bits;
            const int shift = static_cast<int>(bit & 7);
            uint32_t word = bytes[bit >> 3];
            if (shift + bits > 8) word |= static_cast<uint32_t>(bytes[(bit >> 3) + 1]) << 8;
            row[i] = cpu::from_float<T>(static_cast<float>((word >> shift) & mask) * s + b);
          }
        }
      }
    });
  });
}

}  // namespace pagekernels
