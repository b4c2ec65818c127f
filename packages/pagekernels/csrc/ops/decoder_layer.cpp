// decoder_layer: op function (boundary checks; one DecoderLayer node for a GPU decode step, the
// other ops composed otherwise) and DecoderLayer::eval_gpu.
#include <array>

#include "mlx/fast.h"
#include "ops/checks.h"
#include "ops/gpu.h"
#include "pagekernels.h"
#include "primitives.h"

namespace pagekernels {

namespace {

constexpr std::string_view kOp = "decoder_layer";

// The weights in their order: a norm's weight is [width], a projection's [N, K].
struct WeightSlot {
  const char* name;
  bool is_norm;
};
constexpr std::array<WeightSlot, kDecoderLayerWeights> kWeightSlots = {{
    {"input_layernorm", true},
    {"qkv_proj", false},
    {"q_norm", true},
    {"k_norm", true},
    {"o_proj", false},
    {"post_attention_layernorm", true},
    {"gate_up_proj", false},
    {"down_proj", false},
}};

// The layer's widths, read from the inputs' shapes.
struct LayerShape {
  int batch;         // B
  int query_len;     // L
  int hidden;        // H
  int num_q_heads;   // Hq
  int num_kv_heads;  // Hkv
  int head_dim;      // D
  int intermediate;  // I
};

std::string weight_name(size_t index) {
  return "weights[" + std::to_string(index) + "] (" + kWeightSlots[index].name + ")";
}

void check_weight(const mx::array& w, size_t index, const mx::array& residual,
                  const mx::Shape& shape) {
  check(w.dtype() == residual.dtype(), kOp, [&] {
    return weight_name(index) + " must have residual's dtype " + dtype_str(residual.dtype()) +
           ", got " + dtype_str(w.dtype());
  });
  check(w.shape() == shape, kOp, [&] {
    std::string expected;
    for (int n : shape) expected += (expected.empty() ? "" : ", ") + std::to_string(n);
    return weight_name(index) + " must have shape (" + expected +
           (shape.size() == 1 ? ",)" : ")") + " for this layer, got " + shape_str(w);
  });
}

LayerShape check_layer(const mx::array& residual, const std::optional<mx::array>& pending,
                       const std::vector<mx::array>& w, const mx::array& key_pages,
                       const mx::array& value_pages, const mx::array& block_table,
                       const mx::array& context_lens, const mx::array& slot_mapping,
                       const mx::array& offsets, int page_size) {
  check_rank(kOp, residual, "residual", 3, "[B, L, H]");
  check_float_dtype(kOp, residual, "residual");
  if (pending) {
    check_same_shape(kOp, residual, "residual", *pending, "pending");
    check_same_dtype(kOp, residual, "residual", *pending, "pending");
  }
  check_paged_kv(kOp, key_pages, value_pages, block_table, context_lens, page_size);
  check_same_dtype(kOp, residual, "residual", key_pages, "key_pages");
  check_dim(kOp, residual, 0, "residual", block_table, 0, "block_table");
  check_rank(kOp, slot_mapping, "slot_mapping", 1, "[B * L]");
  check_dtype(kOp, slot_mapping, "slot_mapping", mx::int32);
  check(slot_mapping.shape(0) == residual.shape(0) * residual.shape(1), kOp, [&] {
    return "slot_mapping must hold B * L = " +
           std::to_string(residual.shape(0) * residual.shape(1)) + " slots (one per new token), " +
           "got " + shape_str(slot_mapping);
  });
  check_rank(kOp, offsets, "offsets", 1, "[B]");
  check_dtype(kOp, offsets, "offsets", mx::int32);
  check_dim(kOp, residual, 0, "residual", offsets, 0, "offsets");
  check(w.size() == kDecoderLayerWeights, kOp, [&] {
    return "weights must hold the layer's " + std::to_string(kDecoderLayerWeights) +
           " arrays (input_layernorm, qkv_proj, q_norm, k_norm, o_proj, "
           "post_attention_layernorm, gate_up_proj, down_proj), got " + std::to_string(w.size());
  });
  for (size_t i = 0; i < w.size(); ++i) {
    const bool norm = kWeightSlots[i].is_norm;
    check(w[i].ndim() == (norm ? 1 : 2), kOp, [&] {
      const char* expected =
          norm ? " must be a norm's [width]" : " must be a projection's [N, K]";
      return weight_name(i) + expected + ", got shape " + shape_str(w[i]);
    });
  }

  LayerShape s{residual.shape(0), residual.shape(1), residual.shape(2), 0,
               key_pages.shape(1), key_pages.shape(3), w[6].shape(0) / 2};
  const int D = s.head_dim;
  const int q_width = w[1].shape(0) - 2 * s.num_kv_heads * D;
  check(D > 0 && D % 2 == 0 && q_width > 0 && q_width % D == 0, kOp, [&] {
    return "qkv_proj must stack Hq * D query rows and 2 * Hkv * D = " +
           std::to_string(2 * s.num_kv_heads * D) + " key/value rows (Hkv, D even from the " +
           "pages), got " + std::to_string(w[1].shape(0)) + " rows";
  });
  s.num_q_heads = q_width / D;
  check_gqa(kOp, s.num_q_heads, s.num_kv_heads);
  check(w[6].shape(0) % 2 == 0, kOp, [&] {
    return "gate_up_proj must stack gate and up rows (an even count), got " + shape_str(w[6]);
  });
  const int H = s.hidden, I = s.intermediate;
  check_weight(w[0], 0, residual, {H});
  check_weight(w[1], 1, residual, {q_width + 2 * s.num_kv_heads * D, H});
  check_weight(w[2], 2, residual, {D});
  check_weight(w[3], 3, residual, {D});
  check_weight(w[4], 4, residual, {H, q_width});
  check_weight(w[5], 5, residual, {H});
  check_weight(w[6], 6, residual, {2 * I, H});
  check_weight(w[7], 7, residual, {H, I});
  return s;
}

// Whether one DecoderLayer node computes this layer on `stream` (else the ops are composed):
// what the linear kernel (<= kLinearMaxRows rows, K % 64 == 0: H, I and Hq * D, the last
// implied by D % 64 == 0), add_rms_norm (rows up to kAddRmsNormMaxWidth) and decode_qkv (a
// norm_rope kernel head dim) take, and no empty dimension.
bool fuses(const LayerShape& s, mx::Dtype dtype, const mx::Stream& stream) {
  return stream.device == mx::Device::gpu && s.query_len == 1 && s.batch >= 1 &&
         s.batch <= kLinearMaxRows && (dtype == mx::float16 || dtype == mx::bfloat16) &&
         s.hidden > 0 && s.hidden % 64 == 0 && s.hidden <= kAddRmsNormMaxWidth &&
         s.intermediate > 0 && s.intermediate % 64 == 0 &&
         gpu_norm_rope_supports_head_dim(s.head_dim);
}

mx::array silu(const mx::array& x, const mx::Stream& s) {
  return mx::multiply(x, mx::sigmoid(x, s), s);
}

}  // namespace

std::tuple<mx::array, mx::array, mx::array, mx::array> decoder_layer(
    const mx::array& residual, const std::optional<mx::array>& pending,
    const std::vector<mx::array>& weights, const mx::array& key_pages,
    const mx::array& value_pages, const mx::array& block_table, const mx::array& context_lens,
    const mx::array& slot_mapping, const mx::array& offsets, int page_size, float eps,
    float rope_base, std::optional<float> scale, mx::StreamOrDevice s) {
  const LayerShape shape = check_layer(residual, pending, weights, key_pages, value_pages,
                                       block_table, context_lens, slot_mapping, offsets,
                                       page_size);
  check_finite_positive(kOp, "eps", eps);
  check_finite_positive(kOp, "rope_base", rope_base);
  const auto stream = mx::to_stream(s);
  check_gpu_head_dim(kOp, stream, shape.head_dim);
  const float softmax_scale = resolve_scale(kOp, scale, shape.head_dim);
  const auto& w = weights;

  if (fuses(shape, residual.dtype(), stream)) {
    std::vector<mx::array> inputs{residual};
    if (pending) inputs.push_back(*pending);
    inputs.insert(inputs.end(), w.begin(), w.end());
    inputs.insert(inputs.end(),
                  {key_pages, value_pages, block_table, context_lens, slot_mapping, offsets});
    auto outputs = mx::array::make_arrays(
        {residual.shape(), residual.shape(), key_pages.shape(), value_pages.shape()},
        {residual.dtype(), residual.dtype(), key_pages.dtype(), value_pages.dtype()},
        std::make_shared<DecoderLayer>(stream, pending.has_value(), eps, rope_base,
                                       softmax_scale),
        std::move(inputs));
    return {outputs[0], outputs[1], outputs[2], outputs[3]};
  }

  // The same equation from the other ops (CPU streams, prefill chunks, shapes the kernels
  // do not take).
  const auto [B, L, H, Hq, Hkv, D, I] = shape;
  auto [h, x] = pending ? add_rms_norm(residual, *pending, w[0], eps, stream)
                        : std::pair{residual, mx::fast::rms_norm(residual, w[0], eps, stream)};
  auto qkv = split_linear(x, w[1], {Hq * D, Hkv * D, Hkv * D}, std::nullopt, stream);
  auto queries = norm_rope(mx::reshape(qkv[0], {B, L, Hq, D}, stream), w[2], offsets, eps,
                           rope_base, stream);
  auto keys = norm_rope(mx::reshape(qkv[1], {B, L, Hkv, D}, stream), w[3], offsets, eps,
                        rope_base, stream);
  auto tokens = [&](const mx::array& a) { return mx::reshape(a, {B * L, Hkv, D}, stream); };
  auto [new_key_pages, new_value_pages] =
      write_kv(key_pages, value_pages, tokens(mx::transpose(keys, {0, 2, 1, 3}, stream)),
               tokens(qkv[2]), slot_mapping, stream);
  auto attended = paged_attention(queries, new_key_pages, new_value_pages, block_table,
                                  context_lens, page_size, softmax_scale, "causal", stream);
  auto projected = linear(
      mx::reshape(mx::transpose(attended, {0, 2, 1, 3}, stream), {B, L, Hq * D}, stream), w[4],
      std::nullopt, stream);
  auto [h_out, normed] = add_rms_norm(h, projected, w[5], eps, stream);
  auto gate_up = split_linear(normed, w[6], {I, I}, std::nullopt, stream);
  auto mlp = linear(mx::multiply(silu(gate_up[0], stream), gate_up[1], stream), w[7],
                    std::nullopt, stream);
  return {h_out, mlp, new_key_pages, new_value_pages};
}

void DecoderLayer::eval_cpu(const std::vector<mx::array>&, std::vector<mx::array>&) {
  throw std::logic_error(
      "[decoder_layer] the DecoderLayer node runs on GPU streams only (the op composes the "
      "other ops on CPU streams)");
}

void DecoderLayer::eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
#ifdef PAGEKERNELS_WITH_CUDA
  const mx::array& key_pages = inputs[inputs.size() - 6];  // then value_pages and 4 tables
  const int head_dim = key_pages.shape(3);
  cuda::decoder_layer(cuda::row_major(inputs, stream()), outputs, has_pending_, eps_, scale_,
                      rope_inv_frequencies(head_dim, rope_base_).data(), stream());
#else
  throw_no_gpu_kernels(kOp);
#endif
}

}  // namespace pagekernels
