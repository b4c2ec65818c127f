// Device helpers shared by the CUDA kernels: dtype conversion, 16-byte vector access, cp.async,
// ldmatrix, mma.sync and warp reductions. Raw pointers only; no MLX headers (house style H14).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace pagekernels::cuda {

// ---- dtype conversion -------------------------------------------------------------------------

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(x);
  } else {
    return __float2bfloat16_rn(x);
  }
}

// Two floats packed as a 16-bit pair (lo in the low half), the A-operand format of mma.sync.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  } else {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&h);
  }
}

// ---- 16-byte vectors --------------------------------------------------------------------------

// N elements of T (N * sizeof(T) a multiple of 16, 16-byte aligned) to float.
template <typename T, int N>
__device__ __forceinline__ void load_float(const T* p, float (&out)[N]) {
  static_assert((N * sizeof(T)) % 16 == 0, "whole 16-byte vectors only");
  constexpr int kPerVec = 16 / sizeof(T);
#pragma unroll
  for (int w = 0; w < N / kPerVec; ++w) {
    uint4 raw = reinterpret_cast<const uint4*>(p)[w];
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < kPerVec; ++i) out[w * kPerVec + i] = to_float(e[i]);
  }
}

// N floats rounded to T and stored as whole 16-byte vectors (or 8 bytes for 4 x 16-bit).
template <typename T, int N>
__device__ __forceinline__ void store_float(T* p, const float (&in)[N]) {
  static_assert((N * sizeof(T)) % 8 == 0, "whole 8-byte vectors only");
  if constexpr ((N * sizeof(T)) % 16 == 0) {
    constexpr int kPerVec = 16 / sizeof(T);
#pragma unroll
    for (int w = 0; w < N / kPerVec; ++w) {
      uint4 raw;
      T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int i = 0; i < kPerVec; ++i) e[i] = from_float<T>(in[w * kPerVec + i]);
      reinterpret_cast<uint4*>(p)[w] = raw;
    }
  } else {
    constexpr int kPerVec = 8 / sizeof(T);
#pragma unroll
    for (int w = 0; w < N / kPerVec; ++w) {
      uint2 raw;
      T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int i = 0; i < kPerVec; ++i) e[i] = from_float<T>(in[w * kPerVec + i]);
      reinterpret_cast<uint2*>(p)[w] = raw;
    }
  }
}

// Tiles of kTile keys that cover keys [begin, end); 0 when the range is empty.
template <int kTile>
__device__ __forceinline__ int tile_count(int begin, int end) {
  return end > begin ? (end - begin + kTile - 1) / kTile : 0;
}

// The 32-bit shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- cp.async (sm_80+) ------------------------------------------------------------------------

// 16-byte global -> shared copy that bypasses L1. valid == false writes 16 zero bytes and reads
// nothing (src-size 0), so masked rows can never bring NaN garbage into shared memory.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const uint32_t dst = shared_address(smem);
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Wait until every cp.async this thread issued has landed, committed or not.
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_all;\n" ::: "memory");
}

// Wait until at most `kPending` committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ---- ldmatrix / mma.sync (sm_80+) -------------------------------------------------------------

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  const uint32_t a = shared_address(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  const uint32_t a = shared_address(smem);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// c (16x8 f32) += a (16x16, row) * b (16x8, col), T = __half or __nv_bfloat16.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, "
        "%7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// ---- math and warp reductions -----------------------------------------------------------------

// 2^x with flush-to-zero; exp2(-inf) = 0, which is how masked scores drop out.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// x, but opaque to the optimiser (ptxas sees a plain mov): values computed from it are not
// hoisted out of the loop that uses them, where they would hold registers across it or spill.
__device__ __forceinline__ int opaque(int x) {
  asm volatile("mov.b32 %0, %0;" : "+r"(x));
  return x;
}

// log2(x) for x > 0 (MUFU.LG2).
__device__ __forceinline__ float fast_log2(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Sum over aligned groups of kWidth consecutive lanes (kWidth a power of two <= 32).
template <int kWidth>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) {
    x += __shfl_xor_sync(0xffffffffu, x, offset);
  }
  return x;
}

template <int kWidth>
__device__ __forceinline__ float group_max(float x) {
#pragma unroll
  for (int offset = kWidth / 2; offset > 0; offset /= 2) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

}  // namespace pagekernels::cuda
