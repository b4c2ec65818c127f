// Synchronisation for warp-specialised kernels (sm_90a): shared-memory mbarriers that hand
// pipeline stages between a producer and consumer warpgroups, named barriers among subsets of
// the CTA, and the per-warpgroup register budget (setmaxnreg, sm_90a only).
//
// An mbarrier completes a phase when its expected number of arrivals has arrived; waiters name
// the phase they wait for by its parity (phase k of a barrier used once per pipeline round k).
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/device_utils.cuh"

namespace pagekernels::cuda {

// One thread initialises; the CTA synchronises (__syncthreads) before any use.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(bar)),
               "r"(arrivals)
               : "memory");
}

// Arrives with release semantics: this thread's earlier shared writes are visible to the
// threads whose wait sees the phase complete.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(
                   shared_address(bar))
               : "memory");
}

// Arrives (counting as one of the expected arrivals) once every cp.async this thread issued so
// far has landed.
__device__ __forceinline__ void mbarrier_arrive_on_cp_async(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(
                   shared_address(bar))
               : "memory");
}

// Arrives (release) and adds `bytes` to the transaction count that the phase also waits for:
// the bulk copies that complete on this barrier (tma_load_2d) must deliver that many bytes.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   shared_address(bar)),
               "r"(bytes)
               : "memory");
}

// TMA: copies the box at (column, row) of a 2D tensor map into shared memory at `dst` and
// completes that many bytes of `bar`'s transaction count when they have landed. `map` is a
// __grid_constant__ kernel parameter (its generic address is what the instruction takes).
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, int column,
                                            int row, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(shared_address(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(column), "r"(row), "r"(shared_address(bar))
      : "memory");
}

// Blocks until the phase with this parity has completed (acquire).
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
}

// Named barriers 1..15 (0 is __syncthreads): `threads` (a multiple of 32) take part, some
// waiting (sync) and the others only arriving.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Gives this warpgroup's registers above kRegs back to the CTA's pool / takes registers from it
// up to kRegs per thread (all four warps of the warpgroup execute it).
template <int kRegs>
__device__ __forceinline__ void release_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

template <int kRegs>
__device__ __forceinline__ void claim_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace pagekernels::cuda
