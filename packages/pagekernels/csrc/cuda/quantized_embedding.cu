// pagekernels::cuda::quantized_embedding: dequantize the rows of an mx.quantize'd (affine) table
// selected by `indices`. Packing, for every bit width: a row's values form a little-endian bit
// stream, value j at bits [j * bits, (j + 1) * bits) (for bits 2/4/8: bits (j*bits) % 32 of word
// j*bits/32). value = q * scale + bias per group. Out-of-range indices give zero rows, as on CPU.
#include "cuda/device_utils.cuh"
#include "cuda/launch.h"
#include "cuda/launch_utils.cuh"

namespace pagekernels::cuda {

namespace {

constexpr int kEmbeddingThreads = 128;

// One CTA per index; threads stride over the row's dims (adjacent threads share packed words).
template <typename T>
__global__ void __launch_bounds__(kEmbeddingThreads)
    quantized_embedding_kernel(const int32_t* indices, const uint32_t* weight, const T* scales,
                               const T* biases, T* out, int num_rows, int words_per_row, int dims,
                               int group_size, int bits) {
  const int64_t n = blockIdx.x;
  const int r = indices[n];
  T* row = out + n * dims;
  if (r < 0 || r >= num_rows) {
    for (int j = threadIdx.x; j < dims; j += kEmbeddingThreads) row[j] = from_float<T>(0.0f);
    return;
  }
  const uint32_t* words = weight + int64_t{r} * words_per_row;
  const int groups = dims / group_size;
  const uint32_t mask = (1u << bits) - 1u;
  for (int j = threadIdx.x; j < dims; j += kEmbeddingThreads) {
    const int64_t bit = int64_t{j} * bits;
    const int word = static_cast<int>(bit >> 5);
    const int shift = static_cast<int>(bit & 31);
    uint32_t q = words[word] >> shift;
    if (shift + bits > 32) q |= words[word + 1] << (32 - shift);
    const int64_t g = int64_t{r} * groups + j / group_size;
    // Separate multiply and add (no FMA contraction), as the CPU kernel computes it.
    const float value = __fadd_rn(__fmul_rn(static_cast<float>(q & mask), to_float(scales[g])),
                                  to_float(biases[g]));
    row[j] = from_float<T>(value);
  }
}

}  // namespace

void quantized_embedding(const mx::array& indices, const mx::array& weight,
                         const mx::array& scales, const mx::array& biases, mx::array& out,
                         int group_size, int bits, const mx::Stream& s) {
  NvtxRange range("pagekernels::quantized_embedding");
  if (bits < 1 || bits > 8) {
    throw std::invalid_argument("[quantized_embedding] the CUDA kernel takes 1 to 8 bits, got " +
                                std::to_string(bits));
  }
  auto& enc = mx::cu::get_command_encoder(s);
  out.set_data(mx::allocator::malloc(out.nbytes()));
  enc.set_input_array(indices);
  enc.set_input_array(weight);
  enc.set_input_array(scales);
  enc.set_input_array(biases);
  enc.set_output_array(out);

  const int32_t* idx = mx::gpu_ptr<int32_t>(indices);
  const uint32_t* packed = mx::gpu_ptr<uint32_t>(weight);
  int num_rows = weight.shape(0);
  int words_per_row = weight.shape(1);
  int dims = out.shape(1);
  dispatch_float(scales.dtype(), "quantized_embedding", [&](auto tag) {
    using T = decltype(tag);
    const T* scale = mx::gpu_ptr<T>(scales);
    const T* bias = mx::gpu_ptr<T>(biases);
    T* rows = mx::gpu_ptr<T>(out);
    const KernelInfo info =
        kernel_info(enc, reinterpret_cast<const void*>(&quantized_embedding_kernel<T>),
                    kEmbeddingThreads, 0);
    add_kernel(enc, info, dim3(indices.shape(0)), kEmbeddingThreads, 0, idx, packed, scale, bias,
               rows, num_rows, words_per_row, dims, group_size, bits);
  });
}

}  // namespace pagekernels::cuda
