// pagekernels::cuda::linear: y [M, N] = x [M, K] @ w [N, K]^T for the few rows of a decode step
// (M <= kLinearMaxRows), float16/bfloat16 with fp32 accumulation.
//
// Why a kernel of our own: for 1 < M MLX 0.32 runs every matmul through cuBLASLt, building the
// descriptors, querying the heuristic and stream-capturing the call on every evaluation: about
// 20 us of host time per projection, more than streaming its weights (decode_step.py: 253
// projections of Qwen3-4B took 5.5 ms at M = 4 against a 1.9 ms weight floor). This kernel is one
// graph node and reads each weight byte once.
//
// Mapping ("swap AB"): the weight rows are the 16 rows of an m16n8k16 A operand and the x rows
// the 8 columns of B (two B tiles for M <= 16). Per 64-k block, lane (g = lane / 4, c = lane % 4)
// loads k = 8c .. 8c + 7 and 32 + 8c .. 32 + 8c + 7 of weight rows n0 + g and n0 + g + 8 and of
// x row g as 16-byte vectors (each load instruction reads 64 contiguous bytes per row). A dot
// product may visit k in any order, as long as A and B agree: mma step j takes the lane's
// elements 4j .. 4j + 3 as its k pairs {2c, 2c + 1} and {2c + 8, 2c + 9}, for A and for B alike,
// so no shuffle or shared-memory staging is needed.
//
// Stacked weights (split_linear): the output columns are split into up to kLinearMaxParts
// contiguous arrays; the epilogue writes column n into the part that holds it.
//
// Work split: a CTA owns 16 output columns; its kWarps warps take consecutive shares of K and
// add their tiles through shared memory. Measured on the H200 at every Qwen3-4B projection
// (benchmarks/decode_step.py): 4, 8 or 16 warps per CTA time the same within 5 %; splitting K
// across the CTAs of a thread-block cluster was no faster either, and MLX updates cached graph
// executables in place, which does not carry a node's cluster configuration over safely (wrong
// results on the H200). Both were dropped. So was splitting K across ordinary CTAs (the last
// CTA per tile adding the partials, self-resetting arrival counters; 3600b8a): in the traced
// compiled step the 160-tile o_proj/down_proj launches took 12.7 us per call unsplit against
// 15.7-17.7 us split 2, 3 or 4 ways, and every other shape got slower too.
#include "cuda/device_utils.cuh"
#include "cuda/launch.h"
#include "cuda/launch_utils.cuh"
#include "kernels/gpu_limits.h"

namespace pagekernels::cuda {

namespace {

constexpr int kColumns = 16;  // output columns (weight rows) per CTA
constexpr int kBlockK = 64;   // k per lane group per step: 4 lanes x 16 elements
constexpr int kUnroll = 4;    // k blocks whose loads are in flight together
constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;

// 16 bytes through the non-coherent path without allocating in L1: every weight byte is read
// once, the x rows are what L1 should keep.
__device__ __forceinline__ uint4 load_streaming(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

constexpr int kMaxParts = kLinearMaxParts;

// Where output column n goes: part p holds columns start[p] .. start[p + 1] - 1, row-major.
template <typename T>
struct OutputParts {
  T* data[kMaxParts];
  int start[kMaxParts + 1];
  int count;

  __device__ T* column(int m, int n) const {
    // Constant indices only (unrolled), so the parameter struct is not copied to local memory.
    T* base = data[0];
    int first = 0, end = start[1];
#pragma unroll
    for (int p = 1; p < kMaxParts; ++p) {
      if (p < count && n >= start[p]) {
        base = data[p];
        first = start[p];
        end = start[p + 1];
      }
    }
    return base + int64_t{m} * (end - first) + (n - first);
  }
};

template <int kTilesM>
struct Fragments {
  uint4 w[2][2];        // [row g / g + 8][k 8c.. / 32 + 8c..]
  uint4 x[kTilesM][2];  // [x row 8t + g][k 8c.. / 32 + 8c..]
};

template <typename T, int kTilesM>
__device__ __forceinline__ void load_block(Fragments<kTilesM>& f, const T* w_lo, const T* w_hi,
                                           const T* const (&x_rows)[kTilesM], int64_t k) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    f.w[0][h] = w_lo ? load_streaming(w_lo + k + 32 * h) : make_uint4(0, 0, 0, 0);
    f.w[1][h] = w_hi ? load_streaming(w_hi + k + 32 * h) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int t = 0; t < kTilesM; ++t) {
      f.x[t][h] = x_rows[t] ? __ldg(reinterpret_cast<const uint4*>(x_rows[t] + k + 32 * h))
                            : make_uint4(0, 0, 0, 0);
    }
  }
}

__device__ __forceinline__ uint32_t word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

template <typename T, int kTilesM>
__device__ __forceinline__ void multiply_block(const Fragments<kTilesM>& f,
                                               float (&acc)[kTilesM][4]) {
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int h = j / 2;         // which 16-byte vector
    const int e = 2 * (j % 2);   // its first word of this step
    const uint32_t a[4] = {word(f.w[0][h], e), word(f.w[1][h], e), word(f.w[0][h], e + 1),
                           word(f.w[1][h], e + 1)};
#pragma unroll
    for (int t = 0; t < kTilesM; ++t) {
      mma_16816<T>(acc[t], a, word(f.x[t][h], e), word(f.x[t][h], e + 1));
    }
  }
}

template <typename T, int kTilesM>
__global__ void __launch_bounds__(kThreads)
    linear_kernel(const T* x, const T* w, OutputParts<T> y, int rows, int columns, int depth) {
  __shared__ float partial[kWarps][kColumns][8 * kTilesM];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int g = lane / 4;
  const int c = lane % 4;
  const int n0 = static_cast<int>(blockIdx.x) * kColumns;

  // Rows past the matrix read nothing (null) and contribute zeros.
  const T* w_lo = n0 + g < columns ? w + int64_t{n0 + g} * depth + 8 * c : nullptr;
  const T* w_hi = n0 + g + 8 < columns ? w + int64_t{n0 + g + 8} * depth + 8 * c : nullptr;
  const T* x_rows[kTilesM];
#pragma unroll
  for (int t = 0; t < kTilesM; ++t) {
    x_rows[t] = 8 * t + g < rows ? x + int64_t{8 * t + g} * depth + 8 * c : nullptr;
  }

  float acc[kTilesM][4] = {};
  const int num_blocks = depth / kBlockK;
  const int per_warp = (num_blocks + kWarps - 1) / kWarps;
  const int first = warp * per_warp;
  const int last = min(first + per_warp, num_blocks);
  for (int b = first; b < last; b += kUnroll) {
    Fragments<kTilesM> f[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (b + u < last) load_block<T>(f[u], w_lo, w_hi, x_rows, int64_t{b + u} * kBlockK);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (b + u < last) multiply_block<T>(f[u], acc);
    }
  }

  // acc[t] is D[n][m] for n = g, g + 8 and m = 8t + 2c, 8t + 2c + 1.
#pragma unroll
  for (int t = 0; t < kTilesM; ++t) {
    partial[warp][g][8 * t + 2 * c] = acc[t][0];
    partial[warp][g][8 * t + 2 * c + 1] = acc[t][1];
    partial[warp][g + 8][8 * t + 2 * c] = acc[t][2];
    partial[warp][g + 8][8 * t + 2 * c + 1] = acc[t][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kColumns * 8 * kTilesM; i += kThreads) {
    const int m = i / kColumns;  // consecutive threads write consecutive columns of one row
    const int n = i % kColumns;
    if (m >= rows || n0 + n >= columns) continue;
    float sum = 0.0f;
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) sum += partial[wi][n][m];
    *y.column(m, n0 + n) = from_float<T>(sum);
  }
}

template <typename T, int kTilesM>
void launch_linear(Encoder& enc, const T* x, const T* w, OutputParts<T> y, int rows,
                   int columns, int depth) {
  const KernelInfo info =
      kernel_info(enc, reinterpret_cast<const void*>(&linear_kernel<T, kTilesM>), kThreads, 0);
  add_kernel(enc, info, dim3(static_cast<unsigned>((columns + kColumns - 1) / kColumns)),
             kThreads, 0, x, w, y, rows, columns, depth);
}

}  // namespace

void linear(const mx::array& x_in, const mx::array& weight_in, std::vector<mx::array>& outputs,
            const mx::Stream& s) {
  NvtxRange range("pagekernels::linear");
  if (x_in.dtype() != mx::float16 && x_in.dtype() != mx::bfloat16) {
    throw std::invalid_argument("[linear] the CUDA kernel takes float16 or bfloat16");
  }
  // The kernel's 16-byte loads need dense, aligned rows: views (slices at an offset,
  // transposes) are copied first.
  const mx::array x = row_major(x_in, s, /*aligned16=*/true);
  const mx::array weight = row_major(weight_in, s, /*aligned16=*/true);
  auto& enc = mx::cu::get_command_encoder(s);
  if (outputs.size() > kMaxParts) {
    throw std::invalid_argument("[linear] the CUDA kernel writes at most " +
                                std::to_string(kMaxParts) + " parts");
  }
  enc.set_input_array(x);
  enc.set_input_array(weight);
  for (auto& out : outputs) {
    out.set_data(mx::allocator::malloc(out.nbytes()));
    enc.set_output_array(out);
  }
  const int depth = weight.shape(1);
  const int rows = static_cast<int>(x.size() / depth);  // x [..., K]: leading dims are rows
  const int columns = weight.shape(0);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    const T* xs = mx::gpu_ptr<T>(x);
    const T* ws = mx::gpu_ptr<T>(weight);
    OutputParts<T> ys{};
    ys.count = static_cast<int>(outputs.size());
    for (int p = 0; p < ys.count; ++p) {
      ys.data[p] = mx::gpu_ptr<T>(outputs[p]);
      ys.start[p + 1] = ys.start[p] + outputs[p].shape(-1);
    }
    if (rows <= 8) {
      launch_linear<T, 1>(enc, xs, ws, ys, rows, columns, depth);
    } else {
      launch_linear<T, 2>(enc, xs, ws, ys, rows, columns, depth);
    }
  };
  if (x.dtype() == mx::float16) {
    launch(__half{});
  } else {
    launch(__nv_bfloat16{});
  }
}

}  // namespace pagekernels::cuda
