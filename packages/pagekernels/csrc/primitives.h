// The MLX primitives behind the ops in pagekernels.h. Inference only: no jvp/vjp/vmap (the base
// class throws). eval_cpu lives in csrc/cpu/<op>.cpp, the op function and eval_gpu in
// csrc/ops/<op>.cpp, the CUDA kernels in csrc/cuda/. Inputs arrive validated. On CPU streams
// they are row-contiguous except those the CPU kernels read through strides (Linear's x and
// weight, AddRMSNorm's rows, NormRope's x); on GPU streams they arrive as they are and eval_gpu
// makes the row-major copies its kernels need (cuda::row_major), except NormRope's x.
#pragma once

#include <span>
#include <tuple>
#include <vector>

#include "mlx/primitives.h"

namespace pagekernels {

namespace mx = mlx::core;

// What paged and dense attention share: the attributes (scale, causal) and the output shape.
class Attention : public mx::Primitive {
 public:
  Attention(mx::Stream stream, float scale, bool causal)
      : mx::Primitive(stream), scale_(scale), causal_(causal) {}

  // MLX compares primitives only after checking that their types match.
  bool is_equivalent(const mx::Primitive& other) const override {
    return state() == static_cast<const Attention&>(other).state();
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }
  std::tuple<float, bool> state() const { return {scale_, causal_}; }

 protected:
  const float scale_;
  const bool causal_;
};

// inputs: queries, key_pages, value_pages, block_table, context_lens -> [B,Hq,L,D]
class PagedAttention : public Attention {
 public:
  using Attention::Attention;
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "PagedAttention"; }
};

// inputs: queries, keys, values, key_lens -> [B,Hq,L,D]
class DenseAttention : public Attention {
 public:
  using Attention::Attention;
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "DenseAttention"; }
};

// inputs: key_pages, value_pages, keys, values, slot_mapping -> (key_pages, value_pages).
// Both outputs alias the page buffers: page storage is request state that outlives this call, so
// the write must cost O(T), not a copy of the pool. Hence is_equivalent is always false (two
// writes are never interchangeable) and the result must be used in place of the input pages.
class WriteKV : public mx::Primitive {
 public:
  explicit WriteKV(mx::Stream stream) : mx::Primitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "WriteKV"; }
  bool is_equivalent(const mx::Primitive&) const override { return false; }
  std::tuple<> state() const { return {}; }
};

// inputs: key_pages, value_pages, block_table, context_lens -> ([B,Hkv,max_pages*ps,D], same)
class GatherKV : public mx::Primitive {
 public:
  explicit GatherKV(mx::Stream stream) : mx::Primitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "GatherKV"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }  // no attributes
  std::tuple<> state() const { return {}; }
};

// inputs: indices int32 [N], weight, scales, biases -> [N, dims]
class QuantizedEmbedding : public mx::Primitive {
 public:
  QuantizedEmbedding(mx::Stream stream, int group_size, int bits)
      : mx::Primitive(stream), group_size_(group_size), bits_(bits) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "QuantizedEmbedding"; }
  bool is_equivalent(const mx::Primitive& other) const override;
  std::tuple<int, int> state() const { return {group_size_, bits_}; }

 private:
  const int group_size_;
  const int bits_;
};

// inputs: x [M, K] on CPU streams, x [..., K] on GPU streams (M = x.size() / K), weight [N, K]
// (float16/bfloat16 on the GPU, M <= kLinearMaxRows, K % 64 == 0) -> x @ weight^T split along
// N: output i is [M, widths[i]] (CPU) or [..., widths[i]] (GPU).
class Linear : public mx::Primitive {
 public:
  Linear(mx::Stream stream, std::vector<int> widths)
      : mx::Primitive(stream), widths_(std::move(widths)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "Linear"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return widths_ == static_cast<const Linear&>(other).widths_;
  }
  std::vector<int> state() const { return widths_; }

 private:
  const std::vector<int> widths_;
};

// inputs: residual, update [rows, H] (any strides) on CPU streams, [..., H] on GPU streams;
// weight [H], one float dtype -> (residual + update, rms_norm(residual + update) * weight), each
// of residual's shape, row-major.
class AddRMSNorm : public mx::Primitive {
 public:
  AddRMSNorm(mx::Stream stream, float eps) : mx::Primitive(stream), eps_(eps) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "AddRMSNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return eps_ == static_cast<const AddRMSNorm&>(other).eps_;
  }
  std::tuple<float> state() const { return {eps_}; }

 private:
  const float eps_;
};

// The D/2 RoPE frequencies base^(-2i/D), rounded exactly as MLX's CPU rope rounds them (see
// ops/norm_rope.cpp); computed once per (D, base), valid for the life of the process.
std::span<const float> rope_inv_frequencies(int head_dim, float base);

// inputs: x [B, L, H, D] (any strides), weight [D], offsets int32 [B] -> [B, H, L, D]
class NormRope : public mx::Primitive {
 public:
  NormRope(mx::Stream stream, float eps, float base)
      : mx::Primitive(stream), eps_(eps), base_(base) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "NormRope"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return state() == static_cast<const NormRope&>(other).state();
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    const auto& x = inputs[0];
    return {{x.shape(0), x.shape(2), x.shape(1), x.shape(3)}};
  }
  std::tuple<float, float> state() const { return {eps_, base_}; }

 private:
  const float eps_;
  const float base_;
};

// inputs: residual [B, 1, H], pending [B, 1, H] (when has_pending), the kDecoderLayerWeights
// weights, key_pages, value_pages, block_table, context_lens, slot_mapping, offsets ->
// (h, mlp, key_pages, value_pages), the pages aliasing the inputs' buffers as WriteKV's do.
// GPU only: decoder_layer builds it for decode steps on GPU streams and composes the other ops
// everywhere else, so eval_cpu is never reached.
class DecoderLayer : public mx::Primitive {
 public:
  DecoderLayer(mx::Stream stream, bool has_pending, float eps, float rope_base, float scale)
      : mx::Primitive(stream),
        has_pending_(has_pending),
        eps_(eps),
        rope_base_(rope_base),
        scale_(scale) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  void eval_gpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override;
  const char* name() const override { return "DecoderLayer"; }
  bool is_equivalent(const mx::Primitive&) const override { return false; }  // writes pages
  std::tuple<bool, float, float, float> state() const {
    return {has_pending_, eps_, rope_base_, scale_};
  }

 private:
  const bool has_pending_;
  const float eps_;
  const float rope_base_;
  const float scale_;
};

}  // namespace pagekernels
