// Boundary checks shared by the op functions: each throws std::invalid_argument (ValueError in
// Python) with a message "[op] what was wrong; what was expected". Shapes and dtypes only.
#pragma once

#include <cmath>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

#include "kernels/gpu_limits.h"
#include "mlx/ops.h"
#include "mlx/utils.h"

namespace pagekernels {

namespace mx = mlx::core;

inline std::string shape_str(const mx::array& a) {
  std::ostringstream os;
  os << "(";
  for (int i = 0; i < a.ndim(); ++i) os << (i ? ", " : "") << a.shape(i);
  os << (a.ndim() == 1 ? ",)" : ")");
  return os.str();
}

inline std::string dtype_str(mx::Dtype dtype) {
  std::ostringstream os;
  os << dtype;
  return os.str();
}

[[noreturn]] inline void fail(std::string_view op, const std::string& message) {
  throw std::invalid_argument("[" + std::string(op) + "] " + message);
}

// Throws "[op] message()" unless `ok`. The message is a callable, built only on failure: these
// checks run on every op call (per layer and per step in a model).
template <typename Message>
inline void check(bool ok, std::string_view op, Message&& message) {
  if (!ok) fail(op, message());
}

// `name` must have rank `ndim`; `layout` names the axes, e.g. "[B, Hq, L, D]".
inline void check_rank(std::string_view op, const mx::array& a, std::string_view name, int ndim,
                       std::string_view layout) {
  check(a.ndim() == ndim, op, [&] {
    return std::string(name) + " must have rank " + std::to_string(ndim) + " " +
           std::string(layout) + ", got shape " + shape_str(a);
  });
}

inline void check_dtype(std::string_view op, const mx::array& a, std::string_view name,
                        mx::Dtype expected) {
  check(a.dtype() == expected, op, [&] {
    return std::string(name) + " must be " + dtype_str(expected) + ", got " + dtype_str(a.dtype());
  });
}

// Attention tensors: float32, float16 or bfloat16.
inline void check_float_dtype(std::string_view op, const mx::array& a, std::string_view name) {
  auto t = a.dtype();
  check(t == mx::float32 || t == mx::float16 || t == mx::bfloat16, op, [&] {
    return std::string(name) + " must be float32, float16 or bfloat16, got " + dtype_str(t);
  });
}

inline void check_same_dtype(std::string_view op, const mx::array& a, std::string_view a_name,
                             const mx::array& b, std::string_view b_name) {
  check(a.dtype() == b.dtype(), op, [&] {
    return std::string(b_name) + " must have the dtype of " + std::string(a_name) + " (" +
           dtype_str(a.dtype()) + "), got " + dtype_str(b.dtype());
  });
}

inline void check_same_shape(std::string_view op, const mx::array& a, std::string_view a_name,
                             const mx::array& b, std::string_view b_name) {
  check(a.shape() == b.shape(), op, [&] {
    return std::string(b_name) + " must have the shape of " + std::string(a_name) + " " +
           shape_str(a) + ", got " + shape_str(b);
  });
}

// "the axis of a and of b must agree": dim a.shape(ai) (named an) vs b.shape(bi) (named bn).
inline void check_dim(std::string_view op, const mx::array& a, int ai, std::string_view an,
                      const mx::array& b, int bi, std::string_view bn) {
  check(a.shape(ai) == b.shape(bi), op, [&] {
    return std::string(bn) + ".shape[" + std::to_string(bi) + "]=" + std::to_string(b.shape(bi)) +
           " must equal " + std::string(an) + ".shape[" + std::to_string(ai) + "]=" +
           std::to_string(a.shape(ai));
  });
}

// Grouped-query attention: Hq query heads share Hkv K/V heads.
inline void check_gqa(std::string_view op, int num_q_heads, int num_kv_heads) {
  check(num_kv_heads > 0 && num_q_heads % num_kv_heads == 0, op, [&] {
    return "query heads Hq=" + std::to_string(num_q_heads) +
           " must be a multiple of key/value heads Hkv=" + std::to_string(num_kv_heads);
  });
}

// Page storage [P, Hkv, page_size, D] (K and V alike, float) with its block table int32
// [B, max_pages] and context lengths int32 [B].
inline void check_paged_kv(std::string_view op, const mx::array& key_pages,
                           const mx::array& value_pages, const mx::array& block_table,
                           const mx::array& context_lens, int page_size) {
  check_rank(op, key_pages, "key_pages", 4, "[P, Hkv, page_size, D]");
  check_same_shape(op, key_pages, "key_pages", value_pages, "value_pages");
  check_rank(op, block_table, "block_table", 2, "[B, max_pages]");
  check_rank(op, context_lens, "context_lens", 1, "[B]");
  check_float_dtype(op, key_pages, "key_pages");
  check_same_dtype(op, key_pages, "key_pages", value_pages, "value_pages");
  check_dtype(op, block_table, "block_table", mx::int32);
  check_dtype(op, context_lens, "context_lens", mx::int32);
  check(page_size > 0, op, [&] {
    return "page_size must be positive, got " + std::to_string(page_size);
  });
  check(key_pages.shape(2) == page_size, op, [&] {
    return "key_pages.shape[2]=" + std::to_string(key_pages.shape(2)) +
           " (slots per page) must equal page_size=" + std::to_string(page_size);
  });
  check_dim(op, block_table, 0, "block_table", context_lens, 0, "context_lens");
}

// The CUDA attention kernels' head dims (kernels/gpu_limits.h), checked for GPU streams only.
inline void check_gpu_head_dim(std::string_view op, const mx::Stream& stream, int head_dim) {
  check(stream.device.type != mx::Device::gpu || gpu_supports_head_dim(head_dim), op, [&] {
    return "head dim D=" + std::to_string(head_dim) +
           " is not supported by the GPU kernels; expected a multiple of 8 up to " +
           std::to_string(kGpuMaxHeadDim) + " (the CPU kernels take any D)";
  });
}

// A float attribute that must be finite and positive (eps, a RoPE base).
inline void check_finite_positive(std::string_view op, std::string_view name, float value) {
  check(std::isfinite(value) && value > 0.0f, op, [&] {
    std::ostringstream os;
    os << name << " must be a finite positive number, got " << value;
    return os.str();
  });
}

// mask: nullopt -> no mask, "causal" -> causal; anything else is rejected.
inline bool parse_causal(std::string_view op, const std::optional<std::string>& mask) {
  if (!mask) return false;
  check(*mask == "causal", op, [&] {
    return "mask must be None or \"causal\", got \"" + *mask + "\"";
  });
  return true;
}

inline float resolve_scale(std::string_view op, std::optional<float> scale, int head_dim) {
  if (!scale) return 1.0f / std::sqrt(static_cast<float>(head_dim));
  check(std::isfinite(*scale), op, [&] {
    return "scale must be a finite number, got " + std::to_string(*scale);
  });
  return *scale;
}

// Kernels index inputs as dense row-major buffers. On CPU streams, inputs that are not known to
// be row-contiguous go through mx::contiguous (which shares the buffer when it can). On GPU
// streams they pass as they are and eval_gpu copies the rare strided one (cuda::row_major): a
// decode step would otherwise carry an mx::contiguous node, and its host cost, per input.
inline mx::array row_contiguous(const mx::array& a, const mx::Stream& s) {
  if (s.device == mx::Device::gpu || (a.is_available() && a.flags().row_contiguous)) return a;
  return mx::contiguous(a, false, s);
}

}  // namespace pagekernels
