// CUDA entry points called from the primitives' eval_gpu (compiled only with PAGEKERNELS_CUDA).
// This header stays off mlx/ops.h and mlx/primitives.h: nvcc 13 + GCC 13 cannot parse ops.h.
// Each function allocates its outputs, registers inputs/outputs with MLX's CUDA command encoder,
// and launches through cudaGetFuncBySymbol + add_kernel_node_ex (see the MLX extension notes).
// Inputs arrive validated by the op functions (ranks, dtypes, shapes); kernels still guard every
// page read through PagedKVLayout.
#pragma once

#include <vector>

#include "mlx/array.h"
#include "mlx/stream.h"

namespace pagekernels::cuda {

namespace mx = mlx::core;

// `a` itself when it is row-major (and 16-byte aligned, if `aligned16`), else a dense row-major
// copy made by a kernel in the stream's graph. eval_gpu calls these on inputs that the op
// functions pass as they are (no mx::contiguous node per input on GPU streams).
mx::array row_major(const mx::array& a, const mx::Stream& s, bool aligned16 = false);
std::vector<mx::array> row_major(const std::vector<mx::array>& arrays, const mx::Stream& s);

// q [B,Hq,L,D]; k_pages/v_pages [P,Hkv,page_size,D]; block_table int32 [B,max_pages];
// context_lens int32 [B]; out [B,Hq,L,D] (q's dtype). Chooses decode (L <= 8) or prefill schedule.
void paged_attention(const mx::array& q, const mx::array& k_pages, const mx::array& v_pages,
                     const mx::array& block_table, const mx::array& context_lens, mx::array& out,
                     float scale, bool causal, const mx::Stream& s);

// In place: k_out/v_out alias k_pages/v_pages. keys/values [T,Hkv,D]; slot_mapping int32 [T],
// negative slots skipped.
void write_kv(const mx::array& k_pages, const mx::array& v_pages, const mx::array& keys,
              const mx::array& values, const mx::array& slot_mapping, mx::array& k_out,
              mx::array& v_out, const mx::Stream& s);

// k_out/v_out [B,Hkv,max_pages*page_size,D]; zeros past context_lens[b].
void gather_kv(const mx::array& k_pages, const mx::array& v_pages, const mx::array& block_table,
               const mx::array& context_lens, mx::array& k_out, mx::array& v_out,
               const mx::Stream& s);

// q [B,Hq,L,D]; k/v [B,Hkv,S,D]; key_lens int32 [B] (valid keys per row; causal aligned to it).
void dense_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                     const mx::array& key_lens, mx::array& out, float scale, bool causal,
                     const mx::Stream& s);

// indices int32 [N]; weight uint32 [V, dims*bits/32]; scales/biases [V, dims/group_size];
// out [N, dims] in scales' dtype.
void quantized_embedding(const mx::array& indices, const mx::array& weight,
                         const mx::array& scales, const mx::array& biases, mx::array& out,
                         int group_size, int bits, const mx::Stream& s);

// x [..., K] (M = x.size() / K rows), weight [N, K] (one dtype, float16/bfloat16; M <= 16,
// K % 64 == 0; strided or unaligned views are copied first); outputs: x @ weight^T split along
// N, output i [..., N_i] (at most 4, N_0 + N_1 + ... = N).
void linear(const mx::array& x, const mx::array& weight, std::vector<mx::array>& outputs,
            const mx::Stream& s);

// silu(gate) * up, elementwise over [..., N] row-major arrays of one float dtype (in float32,
// rounded once); out of their shape.
void silu_multiply(const mx::array& gate, const mx::array& up, mx::array& out,
                   const mx::Stream& s);

// residual/update [..., H] row-major, weight [H]; sum and normed of residual's shape. No update
// (nullptr): sum is a copy of residual and normed its RMSNorm.
void add_rms_norm(const mx::array& residual, const mx::array* update, const mx::array& weight,
                  mx::array& sum, mx::array& normed, float eps, const mx::Stream& s);

// x [B,L,H,D] (any strides; D in {64, 128, 192, 256}); weight [D] (x's dtype); offsets int32 [B];
// inv_freqs: the D/2 rotation frequencies (rope_inv_frequencies); out [B,H,L,D].
void norm_rope(const mx::array& x, const mx::array& weight, const mx::array& offsets,
               mx::array& out, float eps, const float* inv_freqs, const mx::Stream& s);

// A decode step's (L = 1) q/k/v after the qkv projection, one launch: qkv [B, 1, (Hq + 2 Hkv) * D]
// row-major; q_norm/k_norm [D]; offsets/slot_mapping int32 [B]; pages [P, Hkv, ps, D] (D % 64
// == 0 up to 256). Writes queries [B, Hq, 1, D] (normed, rotated), the keys (normed, rotated)
// and values into their slots in place (k_out/v_out alias the pages; negative and
// out-of-storage slots skipped). inv_freqs as for norm_rope.
void decode_qkv(const mx::array& qkv, const mx::array& q_norm, const mx::array& k_norm,
                const mx::array& offsets, const mx::array& slot_mapping,
                const mx::array& key_pages, const mx::array& value_pages, mx::array& queries,
                mx::array& k_out, mx::array& v_out, float eps, const float* inv_freqs,
                const mx::Stream& s);

// The DecoderLayer primitive's kernels, in the layer's order (see pagekernels::decoder_layer):
// inputs as DecoderLayer lists them (pending absent when !has_pending), all row-major;
// outputs (h, mlp, key_pages, value_pages). inv_freqs as for norm_rope.
void decoder_layer(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs,
                   bool has_pending, float eps, float scale, const float* inv_freqs,
                   const mx::Stream& s);

}  // namespace pagekernels::cuda
