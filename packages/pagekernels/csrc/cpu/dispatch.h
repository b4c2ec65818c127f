// eval_cpu plumbing: MLX dtype -> CPU storage type, and the encoder preamble every op shares.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include "cpu/float_types.h"
#include "mlx/allocator.h"
#include "mlx/array.h"
#include "mlx/backend/cpu/encoder.h"

namespace pagekernels::cpu {

namespace mx = mlx::core;

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls f(TypeTag<T>{}) with T the storage type of a float32/float16/bfloat16 dtype. The op
// functions admit only these, so anything else is a bug, not user input.
template <typename F>
void dispatch_float(mx::Dtype dtype, const char* op, F&& f) {
  if (dtype == mx::float32) return f(TypeTag<float>{});
  if (dtype == mx::float16) return f(TypeTag<f16>{});
  if (dtype == mx::bfloat16) return f(TypeTag<bf16>{});
  throw std::logic_error(std::string("[") + op + "] unexpected dtype reached the CPU kernel");
}

// Registers inputs and outputs with the stream's CPU encoder (no-ops on CPU in MLX 0.32, kept for
// symmetry with the CUDA encoder, where they order the graph) and returns it.
inline mx::cpu::CommandEncoder& encoder_for(const mx::Stream& stream,
                                            const std::vector<mx::array>& inputs,
                                            std::vector<mx::array>& outputs) {
  auto& enc = mx::cpu::get_command_encoder(stream);
  for (const auto& in : inputs) enc.set_input_array(in);
  for (auto& out : outputs) enc.set_output_array(out);
  return enc;
}

// Gives every output a fresh buffer; returns false when they are all empty (nothing to do).
inline bool allocate_outputs(std::vector<mx::array>& outputs) {
  bool any = false;
  for (auto& out : outputs) {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    any = any || out.size() != 0;
  }
  return any;
}

}  // namespace pagekernels::cpu
