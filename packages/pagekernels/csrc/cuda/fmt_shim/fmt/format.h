// Minimal stand-in for <fmt/format.h>, which the MLX wheel does not ship. MLX's CUDA headers
// (lru_cache.h, jit_module.h, cudnn_utils.h, cublas_utils.h) call fmt::format only to build
// exception messages; MLX uses fmt privately and header-only, so no fmt symbol crosses the libmlx
// ABI. Debian's fmt 9 does not compile under nvcc 13, hence this shim.
#pragma once
#include <sstream>
#include <string>
#include <string_view>

namespace fmt {
template <typename... Args>
std::string format(std::string_view f, Args&&... args) {
  std::ostringstream os;
  os << f;
  ((os << " [" << args << "]"), ...);
  return os.str();
}
}  // namespace fmt
