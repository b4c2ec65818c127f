// pagekernels::cuda::gather_kv: copy each request's pages into dense [B, Hkv, max_pages *
// page_size, D] K/V; rows past context_lens[b], and rows of unmapped pages, become zeros.
#include "cuda/launch.h"
#include "cuda/launch_utils.cuh"
#include "cuda/split_plan.h"
#include "kernels/paged_kv.h"

namespace pagekernels::cuda {

namespace {

constexpr int kGatherThreads = 256;

// grid = (rows of units / kGatherThreads, Hkv, B). `layout.head_dim` counts Units per row.
template <typename Unit>
__global__ void __launch_bounds__(kGatherThreads)
    gather_kv_kernel(const Unit* key_pages, const Unit* value_pages, Unit* keys, Unit* values,
                     PagedKVLayout layout, const int32_t* context_lens) {
  const int b = blockIdx.z;
  const int head = blockIdx.y;
  const int row_units = layout.head_dim;
  const int64_t seq_units = int64_t{layout.max_pages} * layout.page_size * row_units;
  const int64_t i = int64_t{blockIdx.x} * kGatherThreads + threadIdx.x;
  if (i >= seq_units) return;
  const int t = static_cast<int>(i / row_units);
  Unit k{};
  Unit v{};
  if (t < context_lens[b]) {
    const int64_t off = layout.token_offset(b, head, t);
    if (off >= 0) {
      k = key_pages[off + i % row_units];
      v = value_pages[off + i % row_units];
    }
  }
  const int64_t dst = (int64_t{b} * layout.num_kv_heads + head) * seq_units + i;
  keys[dst] = k;
  values[dst] = v;
}

}  // namespace

void gather_kv(const mx::array& k_pages, const mx::array& v_pages, const mx::array& block_table,
               const mx::array& context_lens, mx::array& k_out, mx::array& v_out,
               const mx::Stream& s) {
  NvtxRange range("pagekernels::gather_kv");
  auto& enc = mx::cu::get_command_encoder(s);
  k_out.set_data(mx::allocator::malloc(k_out.nbytes()));
  v_out.set_data(mx::allocator::malloc(v_out.nbytes()));
  enc.set_input_array(k_pages);
  enc.set_input_array(v_pages);
  enc.set_input_array(block_table);
  enc.set_input_array(context_lens);
  enc.set_output_array(k_out);
  enc.set_output_array(v_out);

  const size_t row_bytes = k_pages.shape(3) * k_pages.itemsize();
  const int32_t* lens = mx::gpu_ptr<int32_t>(context_lens);
  dispatch_copy_unit(row_bytes, k_pages.itemsize(), {&k_pages, &v_pages, &k_out, &v_out},
                     [&](auto tag) {
    using Unit = decltype(tag);
    const int row_units = static_cast<int>(row_bytes / sizeof(Unit));
    PagedKVLayout layout{k_pages.shape(0), k_pages.shape(1), k_pages.shape(2), row_units,
                         mx::gpu_ptr<int32_t>(block_table), block_table.shape(1)};
    const Unit* k_src = mx::gpu_ptr<Unit>(k_pages);
    const Unit* v_src = mx::gpu_ptr<Unit>(v_pages);
    Unit* k_dst = mx::gpu_ptr<Unit>(k_out);
    Unit* v_dst = mx::gpu_ptr<Unit>(v_out);
    const int64_t seq_units = int64_t{layout.max_pages} * layout.page_size * row_units;
    const dim3 grid(static_cast<unsigned>(ceil_div(seq_units, kGatherThreads)),
                    layout.num_kv_heads, block_table.shape(0));
    const KernelInfo info = kernel_info(
        enc, reinterpret_cast<const void*>(&gather_kv_kernel<Unit>), kGatherThreads, 0);
    add_kernel(enc, info, grid, kGatherThreads, 0, k_src, v_src, k_dst, v_dst, layout, lens);
  });
}

}  // namespace pagekernels::cuda
