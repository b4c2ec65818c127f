// Host helpers for launching our kernels inside MLX's CUDA graph (mlx-extensions-on-linux.md,
// section 3 and appendix E): a kernel becomes a driver CUfunction through cudaGetFuncBySymbol
// and is added with CommandEncoder::add_kernel_node_ex (runtime kernel pointers fail: libmlx
// links its own static cudart). MLX's check_cuda_error and cu::malloc_async are not exported,
// hence check_cuda and scratch_array here.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "mlx/array.h"
#include "mlx/backend/cuda/device.h"
#include "mlx/backend/cuda/utils.h"

namespace pagekernels::cuda {

namespace mx = mlx::core;
using Encoder = mx::cu::CommandEncoder;

inline void check_cuda(cudaError_t err, std::string_view what) {
  if (err != cudaSuccess) {
    throw std::runtime_error("[pagekernels] " + std::string(what) + " failed: " +
                             cudaGetErrorString(err));
  }
}

// One NVTX range per eval_gpu, so kernels are attributable in Nsight.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

struct KernelInfo {
  CUfunction function;
  int ctas_per_sm;  // resident CTAs per SM at this block size and shared memory
};

// The CUfunction of `kernel` on the encoder's device, with the dynamic shared memory limit
// raised to `smem_bytes` (needed above 48 KB). Cached per (kernel, device, smem).
inline KernelInfo kernel_info(Encoder& enc, const void* kernel, int threads, size_t smem_bytes) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, size_t>, KernelInfo> cache;
  const int device = enc.device().cuda_device();
  std::lock_guard<std::mutex> lock(mutex);
  auto key = std::make_tuple(kernel, device, smem_bytes);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  check_cuda(cudaSetDevice(device), "cudaSetDevice");
  if (smem_bytes > 48 * 1024) {
    check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem_bytes)),
               "cudaFuncSetAttribute(max dynamic shared memory)");
  }
  cudaFunction_t function;
  check_cuda(cudaGetFuncBySymbol(&function, kernel), "cudaGetFuncBySymbol");
  int ctas = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, kernel, threads, smem_bytes),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  KernelInfo info{reinterpret_cast<CUfunction>(function), ctas > 0 ? ctas : 1};
  cache.emplace(key, info);
  return info;
}

inline int sm_count(Encoder& enc) {
  static std::mutex mutex;
  static std::map<int, int> cache;
  const int device = enc.device().cuda_device();
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = cache.find(device); it != cache.end()) return it->second;
  int count = 0;
  check_cuda(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(multiprocessor count)");
  cache.emplace(device, count);
  return count;
}

// Compute capability 9.0 (H100/H200), the only one that runs sm_90a code (wgmma).
inline bool is_sm90(Encoder& enc) {
  const auto& device = enc.device();
  return device.compute_capability_major() == 9 && device.compute_capability_minor() == 0;
}

// Adds `kernel(args...)` as a node of the encoder's graph. Register the node's inputs and
// outputs (set_input_array / set_output_array) before calling.
template <typename... Args>
void add_kernel(Encoder& enc, const KernelInfo& info, dim3 grid, int threads, size_t smem_bytes,
                Args&... args) {
  enc.add_kernel_node_ex(info.function, grid, dim3(threads), dim3{},
                         static_cast<uint32_t>(smem_bytes), args...);
}

// Device scratch that lives until the encoder's graph has run.
inline mx::array scratch_array(Encoder& enc, mx::Shape shape, mx::Dtype dtype) {
  size_t bytes = mx::size_of(dtype);
  for (auto n : shape) bytes *= static_cast<size_t>(n);
  mx::array a(mx::allocator::malloc(bytes), std::move(shape), dtype);
  enc.add_temporary(a);
  return a;
}

// A TMA descriptor of `base` seen as a row-major [rows, cols] matrix of T (16-bit), copied in
// boxes of box_rows x 64 columns into 128-byte-swizzled shared memory (the layout wgmma reads).
// The driver's encoder is reached through the runtime (the extension does not link libcuda).
template <typename T>
CUtensorMap rows_tensor_map(const void* base, int64_t rows, int cols, int box_rows) {
  static_assert(sizeof(T) == 2, "16-bit elements: 64 columns fill a 128-byte swizzle row");
  static const auto encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    check_cuda(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                cudaEnableDefault, &found),
               "cudaGetDriverEntryPointByVersion(cuTensorMapEncodeTiled)");
    if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
      throw std::runtime_error("[pagekernels] the CUDA driver has no cuTensorMapEncodeTiled");
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t row_stride[1] = {static_cast<cuuint64_t>(cols) * sizeof(T)};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult result = encode(
      &map,
      std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
      2, const_cast<void*>(base), dims, row_stride, box, element_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    throw std::runtime_error("[pagekernels] cuTensorMapEncodeTiled failed with CUresult " +
                             std::to_string(static_cast<int>(result)));
  }
  return map;
}

// The kernels use 16-byte vector accesses; MLX allocations are aligned, offset views may not be.
inline void check_aligned(std::string_view op, std::initializer_list<const mx::array*> arrays) {
  for (const mx::array* a : arrays) {
    if (reinterpret_cast<uintptr_t>(mx::gpu_ptr<void>(*a)) % 16 != 0) {
      throw std::runtime_error("[" + std::string(op) +
                               "] CUDA kernels need 16-byte aligned arrays; got an array view at "
                               "byte offset " + std::to_string(a->offset()));
    }
  }
}

// Calls f(Unit{}) with the widest unit a row copy can use: 16-byte vectors when every row is a
// whole number of them and every pointer is 16-byte aligned, else one element (2 or 4 bytes).
template <typename F>
void dispatch_copy_unit(size_t row_bytes, size_t itemsize,
                        std::initializer_list<const mx::array*> arrays, F&& f) {
  bool vector = row_bytes % 16 == 0;
  for (const mx::array* a : arrays) {
    vector = vector && reinterpret_cast<uintptr_t>(mx::gpu_ptr<void>(*a)) % 16 == 0;
  }
  if (vector) return f(uint4{});
  if (itemsize == 2) return f(uint16_t{});
  return f(uint32_t{});
}

// Calls f(T{}) with T the CUDA type of an MLX float dtype.
template <typename F>
void dispatch_float(mx::Dtype dtype, std::string_view op, F&& f) {
  switch (dtype) {
    case mx::float32:
      return f(float{});
    case mx::float16:
      return f(__half{});
    case mx::bfloat16:
      return f(__nv_bfloat16{});
    default:
      throw std::invalid_argument("[" + std::string(op) +
                                  "] CUDA kernels take float32, float16 or bfloat16");
  }
}

}  // namespace pagekernels::cuda
