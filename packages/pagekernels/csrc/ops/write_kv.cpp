// write_kv: op function (boundary checks) and WriteKV::eval_gpu.
#include "ops/checks.h"
#include "ops/gpu.h"
#include "pagekernels.h"
#include "primitives.h"

namespace pagekernels {

namespace {
constexpr std::string_view kOp = "write_kv";
}  // namespace

std::pair<mx::array, mx::array> write_kv(const mx::array& key_pages, const mx::array& value_pages,
                                         const mx::array& keys, const mx::array& values,
                                         const mx::array& slot_mapping, mx::StreamOrDevice s) {
  check_rank(kOp, key_pages, "key_pages", 4, "[P, Hkv, page_size, D]");
  check_same_shape(kOp, key_pages, "key_pages", value_pages, "value_pages");
  check_rank(kOp, keys, "keys", 3, "[T, Hkv, D]");
  check_same_shape(kOp, keys, "keys", values, "values");
  check_rank(kOp, slot_mapping, "slot_mapping", 1, "[T]");
  check_float_dtype(kOp, key_pages, "key_pages");
  check_same_dtype(kOp, key_pages, "key_pages", value_pages, "value_pages");
  check_same_dtype(kOp, key_pages, "key_pages", keys, "keys");
  check_same_dtype(kOp, key_pages, "key_pages", values, "values");
  check_dtype(kOp, slot_mapping, "slot_mapping", mx::int32);
  check_dim(kOp, key_pages, 1, "key_pages", keys, 1, "keys");
  check_dim(kOp, key_pages, 3, "key_pages", keys, 2, "keys");
  check_dim(kOp, keys, 0, "keys", slot_mapping, 0, "slot_mapping");

  auto stream = mx::to_stream(s);
  // Pools from pagepool are row-contiguous, so the write lands in the caller's storage; a
  // strided view would be copied first (row_contiguous, or cuda::row_major in eval_gpu).
  auto outputs = mx::array::make_arrays(
      {key_pages.shape(), value_pages.shape()}, {key_pages.dtype(), value_pages.dtype()},
      std::make_shared<WriteKV>(stream),
      {row_contiguous(key_pages, stream), row_contiguous(value_pages, stream),
       row_contiguous(keys, stream), row_contiguous(values, stream),
       row_contiguous(slot_mapping, stream)});
  return {outputs[0], outputs[1]};
}

void WriteKV::eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) {
  if (inputs[2].size() == 0) {  // no tokens: the pages are the result
    outputs[0].copy_shared_buffer(inputs[0]);
    outputs[1].copy_shared_buffer(inputs[1]);
    return;
  }
#ifdef PAGEKERNELS_WITH_CUDA
  const auto in = cuda::row_major(inputs, stream());
  cuda::write_kv(in[0], in[1], in[2], in[3], in[4], outputs[0], outputs[1], stream());
#else
  throw_no_gpu_kernels(kOp);
#endif
}

}  // namespace pagekernels
