// dense_attention: op function (boundary checks) and DenseAttention::eval_gpu.
#include "ops/checks.h"
#include "ops/gpu.h"
#include "pagekernels.h"
#include "primitives.h"

namespace pagekernels {

namespace {
constexpr std::string_view kOp = "dense_attention";
}  // namespace

mx::array dense_attention(const mx::array& queries, const mx::array& keys,
                          const mx::array& values, std::optional<float> scale,
                          const std::optional<std::string>& mask,
                          const std::optional<mx::array>& key_lens, mx::StreamOrDevice s) {
  check_rank(kOp, queries, "queries", 4, "[B, Hq, L, D]");
  check_rank(kOp, keys, "keys", 4, "[B, Hkv, S, D]");
  check_same_shape(kOp, keys, "keys", values, "values");
  check_float_dtype(kOp, queries, "queries");
  check_same_dtype(kOp, queries, "queries", keys, "keys");
  check_same_dtype(kOp, queries, "queries", values, "values");
  check(queries.shape(3) > 0, kOp, [&] {
    return "head dim D must be positive, got queries of shape " + shape_str(queries);
  });
  check_dim(kOp, queries, 3, "queries", keys, 3, "keys");
  check_dim(kOp, queries, 0, "queries", keys, 0, "keys");
  check_gqa(kOp, queries.shape(1), keys.shape(1));
  if (key_lens) {
    check_rank(kOp, *key_lens, "key_lens", 1, "[B]");
    check_dtype(kOp, *key_lens, "key_lens", mx::int32);
    check_dim(kOp, queries, 0, "queries", *key_lens, 0, "key_lens");
  }
  bool causal = parse_causal(kOp, mask);
  float resolved_scale = resolve_scale(kOp, scale, queries.shape(3));

  auto stream = mx::to_stream(s);
  check_gpu_head_dim(kOp, stream, queries.shape(3));
  // The primitive always takes key_lens, so one kernel serves both cases.
  auto lens = key_lens ? *key_lens : mx::full({queries.shape(0)}, keys.shape(2), mx::int32, stream);
  return mx::array(queries.shape(), queries.dtype(),
                   std::make_shared<DenseAttention>(stream, resolved_scale, causal),
                   {row_contiguous(queries, stream), row_contiguous(keys, stream),
                    row_contiguous(values, stream), row_contiguous(lens, stream)});
}

void DenseAttention::eval_gpu(const std::vector<mx::array>& inputs,
                              std::vector<mx::array>& outputs) {
  if (all_outputs_empty(outputs)) return;
#ifdef PAGEKERNELS_WITH_CUDA
  const auto in = cuda::row_major(inputs, stream());
  cuda::dense_attention(in[0], in[1], in[2], in[3], outputs[0], scale_, causal_, stream());
#else
  throw_no_gpu_kernels(kOp);
#endif
}

}  // namespace pagekernels
