// pagekernels::cuda::decoder_layer: a decode step's decoder layer as one MLX graph node.
//
// Why: MLX spends host time on every graph operation, about 5 us for one with a kernel and
// 1.5 us for a view (benchmarks/decode_step.py, "tiny ops" / "tiny views"). A layer composed of
// the separate ops is 12 kernel operations and about 10 views, and a Qwen3-4B decode step took
// longer to build and submit (4.8 ms) than to run on the GPU (3.5 ms). Here eval_gpu adds the
// kernels to the graph itself: add_rms_norm, the qkv projection, decode_qkv (q/k norm + RoPE
// and the K/V page writes, one launch), paged attention (+ the merge of its key splits),
// o_proj, add_rms_norm, gate_up, silu_multiply and down_proj: 9 launches, 10 with the merge.
// Intermediates are encoder temporaries; reshapes between kernels are views made here, not
// graph nodes. MLX orders the kernels by the buffers each one registers as input and output, as
// it orders separate operations.
#include "cuda/launch.h"
#include "cuda/launch_utils.cuh"

namespace pagekernels::cuda {

namespace {

// A row-major view of row-contiguous `a` with another shape of the same size.
mx::array reshaped(const mx::array& a, mx::Shape shape) {
  mx::Strides strides(shape.size());
  int64_t stride = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= shape[i];
  }
  mx::array view(std::move(shape), a.dtype(), nullptr, {});
  view.copy_shared_buffer(a, strides, a.flags(), a.data_size());
  return view;
}

}  // namespace

void decoder_layer(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs,
                   bool has_pending, float eps, float scale, const float* inv_freqs,
                   const mx::Stream& s) {
  NvtxRange range("pagekernels::decoder_layer");
  auto input = inputs.begin();
  const mx::array& residual = *input++;
  const mx::array* pending = has_pending ? &*input++ : nullptr;
  const mx::array& input_norm = *input++;
  const mx::array& qkv_proj = *input++;
  const mx::array& q_norm = *input++;
  const mx::array& k_norm = *input++;
  const mx::array& o_proj = *input++;
  const mx::array& post_norm = *input++;
  const mx::array& gate_up_proj = *input++;
  const mx::array& down_proj = *input++;
  const mx::array& key_pages = *input++;
  const mx::array& value_pages = *input++;
  const mx::array& block_table = *input++;
  const mx::array& context_lens = *input++;
  const mx::array& slot_mapping = *input++;
  const mx::array& offsets = *input++;
  mx::array& h_out = outputs[0];
  mx::array& mlp_out = outputs[1];

  const int B = residual.shape(0);
  const int H = residual.shape(2);
  const int Hkv = key_pages.shape(1);
  const int D = key_pages.shape(3);
  const int kv_width = Hkv * D;
  const int q_width = qkv_proj.shape(0) - 2 * kv_width;
  const int Hq = q_width / D;
  const int I = down_proj.shape(1);
  // Each intermediate's handle is kept here and registered as a temporary once its launcher
  // has allocated it (below), so it lives until the graph has run.
  std::vector<mx::array> temporaries;
  auto make = [&](mx::Shape shape) {
    return temporaries.emplace_back(std::move(shape), residual.dtype(), nullptr,
                                    std::vector<mx::array>{});
  };

  // Attention: h = residual + pending; h += o_proj(attention(norm_rope(q), pages)).
  mx::array h = make({B, 1, H});
  mx::array x = make({B, 1, H});
  add_rms_norm(residual, pending, input_norm, h, x, eps, s);
  std::vector<mx::array> qkv{make({B, 1, q_width + 2 * kv_width})};
  linear(x, qkv_proj, qkv, s);
  mx::array queries = make({B, Hq, 1, D});
  decode_qkv(qkv[0], q_norm, k_norm, offsets, slot_mapping, key_pages, value_pages, queries,
             outputs[2], outputs[3], eps, inv_freqs, s);
  mx::array attended = make({B, Hq, 1, D});
  paged_attention(queries, outputs[2], outputs[3], block_table, context_lens, attended, scale,
                  /*causal=*/true, s);
  std::vector<mx::array> projected{make({B, 1, H})};
  linear(reshaped(attended, {B, 1, q_width}), o_proj, projected, s);

  // MLP: h_out = h + projected; mlp_out = down_proj(silu(gate) * up) of its norm.
  mx::array normed = make({B, 1, H});
  add_rms_norm(h, &projected[0], post_norm, h_out, normed, eps, s);
  std::vector<mx::array> gate_up{make({B, 1, I}), make({B, 1, I})};
  linear(normed, gate_up_proj, gate_up, s);
  mx::array activated = make({B, 1, I});
  silu_multiply(gate_up[0], gate_up[1], activated, s);
  std::vector<mx::array> mlp{mlp_out};
  linear(activated, down_proj, mlp, s);

  auto& enc = mx::cu::get_command_encoder(s);
  for (const mx::array& a : temporaries) enc.add_temporary(a);
  // Hand the layer to the GPU now. MLX closes and launches a graph only past ~30 kernel nodes
  // (or 400 MB of inputs), so a step's first kernel waited for the host to build three layers:
  // decode_step.py's timeline on the H200 showed 1.6 ms from the step's start to its first
  // kernel, 0.9 ms with a graph per layer (MLX_MAX_OPS_PER_BUFFER=10, compiled step 4.33 ->
  // 4.06 ms in the same run).
  enc.commit();
}

}  // namespace pagekernels::cuda
