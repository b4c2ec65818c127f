// gather_kv: op function (boundary checks) and GatherKV::eval_gpu.
#include "ops/checks.h"
#include "ops/gpu.h"
#include "pagekernels.h"
#include "primitives.h"

namespace pagekernels {

namespace {
constexpr std::string_view kOp = "gather_kv";
}  // namespace

std::pair<mx::array, mx::array> gather_kv(const mx::array& key_pages, const mx::array& value_pages,
                                          const mx::array& block_table,
                                          const mx::array& context_lens, int page_size,
                                          mx::StreamOrDevice s) {
  check_paged_kv(kOp, key_pages, value_pages, block_table, context_lens, page_size);

  auto stream = mx::to_stream(s);
  mx::Shape shape = {block_table.shape(0), key_pages.shape(1), block_table.shape(1) * page_size,
                     key_pages.shape(3)};
  auto outputs = mx::array::make_arrays(
      {shape, shape}, {key_pages.dtype(), value_pages.dtype()}, std::make_shared<GatherKV>(stream),
      {row_contiguous(key_pages, stream), row_contiguous(value_pages, stream),
       row_contiguous(block_table, stream), row_contiguous(context_lens, stream)});
  return {outputs[0], outputs[1]};
}

void GatherKV::eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  if (all_outputs_empty(outputs)) return;
#ifdef PAGEKERNELS_WITH_CUDA
  const auto in = cuda::row_major(inputs, stream());
  cuda::gather_kv(in[0], in[1], in[2], in[3], outputs[0], outputs[1], stream());
#else
  throw_no_gpu_kernels(kOp);
#endif
}

}  // namespace pagekernels
