// pagekernels::cuda::write_kv: scatter T new K/V rows into their page slots, in place. O(T):
// one CTA per token copies its Hkv rows with 16-byte vectors where the row size allows.
#include <algorithm>

#include "cuda/launch.h"
#include "cuda/launch_utils.cuh"
#include "kernels/paged_kv.h"

namespace pagekernels::cuda {

namespace {

// Rows are counted in Units (16-byte vectors or single elements); slot_offset is linear in the
// row length, so it addresses units as well as elements.
template <typename Unit>
__global__ void write_kv_kernel(Unit* key_pages, Unit* value_pages, const Unit* keys,
                                const Unit* values, const int32_t* slot_mapping, int64_t num_slots,
                                int num_kv_heads, int page_size, int row_units) {
  const int64_t token = blockIdx.x;
  const int64_t slot = slot_mapping[token];
  if (slot < 0 || slot >= num_slots) return;  // negative: padding; past the pool: never written
  for (int i = threadIdx.x; i < num_kv_heads * row_units; i += blockDim.x) {
    const int head = i / row_units;
    const int unit = i % row_units;
    const int64_t dst = slot_offset(slot, page_size, num_kv_heads, head, row_units) + unit;
    const int64_t src = (token * num_kv_heads + head) * row_units + unit;
    key_pages[dst] = keys[src];
    value_pages[dst] = values[src];
  }
}

}  // namespace

void write_kv(const mx::array& k_pages, const mx::array& v_pages, const mx::array& keys,
              const mx::array& values, const mx::array& slot_mapping, mx::array& k_out,
              mx::array& v_out, const mx::Stream& s) {
  NvtxRange range("pagekernels::write_kv");
  auto& enc = mx::cu::get_command_encoder(s);
  k_out.copy_shared_buffer(k_pages);
  v_out.copy_shared_buffer(v_pages);
  enc.set_input_array(k_pages);
  enc.set_input_array(v_pages);
  enc.set_input_array(keys);
  enc.set_input_array(values);
  enc.set_input_array(slot_mapping);
  enc.set_output_array(k_out);
  enc.set_output_array(v_out);

  const int num_tokens = keys.shape(0);
  int num_kv_heads = keys.shape(1);
  int page_size = k_pages.shape(2);
  int64_t num_slots = int64_t{k_pages.shape(0)} * page_size;
  const size_t row_bytes = keys.shape(2) * keys.itemsize();
  const int32_t* slots = mx::gpu_ptr<int32_t>(slot_mapping);
  dispatch_copy_unit(row_bytes, keys.itemsize(), {&k_out, &v_out, &keys, &values}, [&](auto tag) {
    using Unit = decltype(tag);
    Unit* k_dst = mx::gpu_ptr<Unit>(k_out);
    Unit* v_dst = mx::gpu_ptr<Unit>(v_out);
    const Unit* k_src = mx::gpu_ptr<Unit>(keys);
    const Unit* v_src = mx::gpu_ptr<Unit>(values);
    int row_units = static_cast<int>(row_bytes / sizeof(Unit));
    const int threads = std::clamp((num_kv_heads * row_units + 31) / 32 * 32, 32, 256);
    const KernelInfo info =
        kernel_info(enc, reinterpret_cast<const void*>(&write_kv_kernel<Unit>), threads, 0);
    add_kernel(enc, info, dim3(num_tokens), threads, 0, k_dst, v_dst, k_src, v_src, slots,
               num_slots, num_kv_heads, page_size, row_units);
  });
}

}  // namespace pagekernels::cuda
