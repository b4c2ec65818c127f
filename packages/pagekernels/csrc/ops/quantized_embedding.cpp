// quantized_embedding: op function (boundary checks), QuantizedEmbedding::eval_gpu and
// equivalence.
#include <algorithm>
#include <array>

#include "ops/checks.h"
#include "ops/gpu.h"
#include "pagekernels.h"
#include "primitives.h"

namespace pagekernels {

namespace {

constexpr std::string_view kOp = "quantized_embedding";
constexpr std::array<int, 7> kBits = {1, 2, 3, 4, 5, 6, 8};  // mx.quantize affine mode
constexpr std::array<int, 3> kGroupSizes = {32, 64, 128};

template <size_t N>
bool contains(const std::array<int, N>& values, int v) {
  return std::find(values.begin(), values.end(), v) != values.end();
}

// Flat int32 indices for the kernel. Wider integer types map out-of-range values to -1 first, so
// truncation to int32 can never turn a bad index into a valid row.
mx::array flat_int32_indices(const mx::array& indices, int num_rows, const mx::Stream& s) {
  auto flat = mx::reshape(indices, {-1}, s);
  auto t = flat.dtype();
  if (t == mx::int64 || t == mx::uint64 || t == mx::uint32) {
    auto valid = mx::logical_and(mx::greater_equal(flat, mx::array(0, t), s),
                                 mx::less(flat, mx::array(num_rows, t), s), s);
    return mx::where(valid, mx::astype(flat, mx::int32, s), mx::array(-1, mx::int32), s);
  }
  return mx::astype(flat, mx::int32, s);
}

}  // namespace

mx::array quantized_embedding(const mx::array& indices, const mx::array& weight,
                              const mx::array& scales, const mx::array& biases, int group_size,
                              int bits, mx::StreamOrDevice s) {
  check(mx::issubdtype(indices.dtype(), mx::integer), kOp, [&] {
    return "indices must have an integer dtype, got " + dtype_str(indices.dtype());
  });
  check(contains(kBits, bits), kOp, [&] {
    return "bits must be one of 1, 2, 3, 4, 5, 6, 8 (mx.quantize affine), got " +
           std::to_string(bits);
  });
  check(contains(kGroupSizes, group_size), kOp, [&] {
    return "group_size must be one of 32, 64, 128, got " + std::to_string(group_size);
  });
  check_rank(kOp, weight, "weight", 2, "[V, dims * bits / 32]");
  check_dtype(kOp, weight, "weight", mx::uint32);
  check_rank(kOp, scales, "scales", 2, "[V, dims / group_size]");
  check_float_dtype(kOp, scales, "scales");
  check_same_shape(kOp, scales, "scales", biases, "biases");
  check_same_dtype(kOp, scales, "scales", biases, "biases");
  check_dim(kOp, weight, 0, "weight", scales, 0, "scales");
  int64_t packed_bits = static_cast<int64_t>(weight.shape(1)) * 32;
  check(packed_bits % bits == 0, kOp, [&] {
    return "weight.shape[1]=" + std::to_string(weight.shape(1)) +
           " uint32 words do not hold a whole number of " + std::to_string(bits) + "-bit values";
  });
  int dims = static_cast<int>(packed_bits / bits);
  check(static_cast<int64_t>(scales.shape(1)) * group_size == dims, kOp, [&] {
    return "scales.shape[1]=" + std::to_string(scales.shape(1)) +
           " must equal dims / group_size = " + std::to_string(dims) + " / " +
           std::to_string(group_size) + " for weight of shape " + shape_str(weight) + " at bits=" +
           std::to_string(bits);
  });

  auto stream = mx::to_stream(s);
  auto flat = flat_int32_indices(indices, weight.shape(0), stream);
  auto rows = mx::array({flat.shape(0), dims}, scales.dtype(),
                        std::make_shared<QuantizedEmbedding>(stream, group_size, bits),
                        {row_contiguous(flat, stream), row_contiguous(weight, stream),
                         row_contiguous(scales, stream), row_contiguous(biases, stream)});
  auto out_shape = indices.shape();
  out_shape.push_back(dims);
  return mx::reshape(rows, out_shape, stream);
}

void QuantizedEmbedding::eval_gpu(const std::vector<mx::array>& inputs,
                                  std::vector<mx::array>& outputs) {
  if (all_outputs_empty(outputs)) return;
#ifdef PAGEKERNELS_WITH_CUDA
  const auto in = cuda::row_major(inputs, stream());
  cuda::quantized_embedding(in[0], in[1], in[2], in[3], outputs[0], group_size_, bits_, stream());
#else
  throw_no_gpu_kernels(kOp);
#endif
}

bool QuantizedEmbedding::is_equivalent(const mx::Primitive& other) const {
  return state() == static_cast<const QuantizedEmbedding&>(other).state();
}

}  // namespace pagekernels
