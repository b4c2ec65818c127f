// paged_attention: op function (boundary checks) and PagedAttention::eval_gpu.
#include "ops/checks.h"
#include "ops/gpu.h"
#include "pagekernels.h"
#include "primitives.h"

namespace pagekernels {

namespace {
constexpr std::string_view kOp = "paged_attention";
}  // namespace

mx::array paged_attention(const mx::array& queries, const mx::array& key_pages,
                          const mx::array& value_pages, const mx::array& block_table,
                          const mx::array& context_lens, int page_size,
                          std::optional<float> scale, const std::optional<std::string>& mask,
                          mx::StreamOrDevice s) {
  check_rank(kOp, queries, "queries", 4, "[B, Hq, L, D]");
  check_float_dtype(kOp, queries, "queries");
  check_same_dtype(kOp, queries, "queries", key_pages, "key_pages");
  check_paged_kv(kOp, key_pages, value_pages, block_table, context_lens, page_size);
  check(queries.shape(3) > 0, kOp, [&] {
    return "head dim D must be positive, got queries of shape " + shape_str(queries);
  });
  check_dim(kOp, queries, 3, "queries", key_pages, 3, "key_pages");
  check_gqa(kOp, queries.shape(1), key_pages.shape(1));
  check_dim(kOp, queries, 0, "queries", block_table, 0, "block_table");
  bool causal = parse_causal(kOp, mask);
  float resolved_scale = resolve_scale(kOp, scale, queries.shape(3));

  auto stream = mx::to_stream(s);
  check_gpu_head_dim(kOp, stream, queries.shape(3));
  return mx::array(
      queries.shape(), queries.dtype(),
      std::make_shared<PagedAttention>(stream, resolved_scale, causal),
      {row_contiguous(queries, stream), row_contiguous(key_pages, stream),
       row_contiguous(value_pages, stream), row_contiguous(block_table, stream),
       row_contiguous(context_lens, stream)});
}

void PagedAttention::eval_gpu(const std::vector<mx::array>& inputs,
                              std::vector<mx::array>& outputs) {
  if (all_outputs_empty(outputs)) return;
#ifdef PAGEKERNELS_WITH_CUDA
  const auto in = cuda::row_major(inputs, stream());
  cuda::paged_attention(in[0], in[1], in[2], in[3], in[4], outputs[0], scale_, causal_, stream());
#else
  throw_no_gpu_kernels(kOp);
#endif
}

}  // namespace pagekernels
