// Hopper warpgroup MMA (wgmma) for the prefill kernel (attention_wgmma.cuh), sm_90a only: the
// kernel guards its body for other targets. Shared memory matrix descriptors for the 128-byte
// swizzle, the fence / commit / wait protocol, and m64n128k16 with A from registers (RS) or
// from shared memory (SS), B from shared memory.
//
// Layout of every shared operand (the Q tile, K and V tiles): 64-element column blocks of
// [rows][64] elements, 128 bytes per row, 16-byte chunk c of row r stored at chunk c ^ (r % 8)
// (CUTLASS's Swizzle<3,4,3>), each block starting on a 1024-byte boundary. The same bytes serve as
//   K-major A (Q K^T: A = Q, rows = queries, contiguous = head dim),
//   K-major B (Q K^T: B = K^T, rows = keys, contiguous = head dim), and
//   MN-major B (P V: B = V, rows = keys, contiguous = head dim, transpose-B = 1).
// Register fragments and accumulators have mma.sync's m16n8k16 layout per warp: warp w of the
// warpgroup owns rows 16w .. 16w + 15; accumulator 4j + e of lane (g = lane / 4, c = lane % 4)
// is row g + 8 (e / 2), column 8j + 2c + (e % 2).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/device_utils.cuh"

namespace pagekernels::cuda {

// Rows of the 128-byte swizzle atom, and the bytes between consecutive 8-row groups.
constexpr int kSwizzleRows = 8;
constexpr uint32_t kSwizzleAtomBytes = 1024;

// Element index of 16-byte chunk `chunk` (8 elements) of row `row` in a [kRows][D] tile of
// 16-bit elements stored as 64-element column blocks with the 128-byte swizzle.
template <int kRows>
__device__ __forceinline__ int swizzle128_position(int row, int chunk) {
  constexpr int kBlockElems = 64;  // elements per 128-byte row of one column block
  return (chunk / 8) * (kRows * kBlockElems) + row * kBlockElems +
         ((chunk % 8) ^ (row % kSwizzleRows)) * 8;
}

// Shared-memory matrix descriptor (PTX "matrix-descriptor-encode"): start address, leading and
// stride byte offsets (all >> 4) and the 128-byte swizzle mode (1 in bits 62-63).
__device__ __forceinline__ uint64_t smem_descriptor(const void* start, uint32_t leading_bytes,
                                                    uint32_t stride_bytes) {
  const uint32_t addr = shared_address(start);
  uint64_t desc = (addr & 0x3FFFF) >> 4;
  desc |= static_cast<uint64_t>((leading_bytes >> 4) & 0x3FFF) << 16;
  desc |= static_cast<uint64_t>((stride_bytes >> 4) & 0x3FFF) << 32;
  desc |= uint64_t{1} << 62;
  return desc;
}

// Orders the generic-proxy shared writes that happen before this point (this thread's, or others'
// acquired through a barrier, cp.async copies included) before later wgmma (async-proxy) reads.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// The compiler does not know that wgmma reads its A registers and writes its accumulators
// asynchronously: fence_registers pins every access to an array after the preceding wgmma_wait
// (and before the next wgmma).
__device__ __forceinline__ void fence_register(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_register(uint32_t& r) {
  asm volatile("" : "+r"(r)::"memory");
}

template <typename R, int N>
__device__ __forceinline__ void fence_registers(R (&regs)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) fence_register(regs[i][e]);
  }
}

// m64n128k16: 64 fp32 accumulators per thread (%0..%63), then the operands.
#define PAGEKERNELS_WGMMA_ACCUMULATORS \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19," \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37," \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55," \
  "%56, %57, %58, %59, %60, %61, %62, %63"
#define PAGEKERNELS_WGMMA_ACCUMULATOR_OPERANDS \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), \
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), \
        "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), \
        "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), \
        "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), \
        "+f"(d[62]), "+f"(d[63])

// Register A: %64..%67 = A, %68 = B descriptor, %69 = scale-d, %70 = transpose-B.
#define PAGEKERNELS_WGMMA_RS_128(TYPE) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " {" \
      PAGEKERNELS_WGMMA_ACCUMULATORS "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n" \
      : PAGEKERNELS_WGMMA_ACCUMULATOR_OPERANDS \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(kTransB))

// Shared A (K-major) and B: %64 = A descriptor, %65 = B descriptor, %66 = scale-d.
#define PAGEKERNELS_WGMMA_SS_128(TYPE) \
  asm volatile( \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " {" \
      PAGEKERNELS_WGMMA_ACCUMULATORS "}, %64, %65, p, 1, 1, 0, 0;\n}\n" \
      : PAGEKERNELS_WGMMA_ACCUMULATOR_OPERANDS \
      : "l"(desc_a), "l"(desc_b), "r"(scale_d))

// acc (64 x 128, fp32) = (scale_d ? acc : 0) + A (64 x 16, registers) * B (16 x 128, shared);
// kTransB = 0 for K-major B, 1 for MN-major B. Asynchronous: see wgmma_commit / wgmma_wait.
template <typename T, int kTransB>
__device__ __forceinline__ void wgmma_rs(float (&acc)[16][4], const uint32_t (&a)[4],
                                         uint64_t desc_b, int scale_d) {
  float(&d)[64] = reinterpret_cast<float(&)[64]>(acc);
  if constexpr (std::is_same_v<T, __half>) {
    PAGEKERNELS_WGMMA_RS_128("f16");
  } else {
    PAGEKERNELS_WGMMA_RS_128("bf16");
  }
}

// acc (64 x 128, fp32) = (scale_d ? acc : 0) + A (64 x 16) * B (16 x 128), both K-major in
// shared memory. Asynchronous: see wgmma_commit / wgmma_wait.
template <typename T>
__device__ __forceinline__ void wgmma_ss(float (&acc)[16][4], uint64_t desc_a, uint64_t desc_b,
                                         int scale_d) {
  float(&d)[64] = reinterpret_cast<float(&)[64]>(acc);
  if constexpr (std::is_same_v<T, __half>) {
    PAGEKERNELS_WGMMA_SS_128("f16");
  } else {
    PAGEKERNELS_WGMMA_SS_128("bf16");
  }
}

#undef PAGEKERNELS_WGMMA_SS_128
#undef PAGEKERNELS_WGMMA_RS_128
#undef PAGEKERNELS_WGMMA_ACCUMULATOR_OPERANDS
#undef PAGEKERNELS_WGMMA_ACCUMULATORS

}  // namespace pagekernels::cuda
