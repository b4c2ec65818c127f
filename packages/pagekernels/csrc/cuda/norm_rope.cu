// pagekernels::cuda::norm_rope: RMSNorm times weight, then non-traditional RoPE, of each [D] row
// of x [B, L, H, D], written transposed to out [B, H, L, D]; float32/float16/bfloat16, fp32 math.
//
// Why: a Qwen3 decode layer ran q_norm, k_norm, rope(q) and rope(k) as four kernels of ~3 us,
// almost all fixed cost; this is one node per tensor.
//
// Mapping: one warp per (b, l, h) row, rows in x's order (consecutive warps read consecutive
// heads of a token). Lane j holds elements j*N .. j*N + N - 1 of both halves (N = D/64), i.e.
// whole rotation pairs (i, i + D/2): the sum of squares is the only cross-lane step. Each element
// is read once and written once, as one N-element access where x's rows allow it (element
// stride 1, aligned; the output always does), else element by element through x's strides.
//
// Angles: the reference rotates pair i by the float32 product position * f_i, and at positions
// of 32k one ulp of the angle is 2e-3 rad; the frequencies f_i therefore come from the host
// (rope_inv_frequencies, MLX's own values) as a kernel parameter, and the position, angle
// use explicitly rounded float32 operations that the compiler cannot fuse into an FMA.
#include "cuda/device_utils.cuh"
#include "cuda/launch.h"
#include "cuda/launch_utils.cuh"
#include "cuda/norm_rope_row.cuh"
#include "kernels/gpu_limits.h"

namespace pagekernels::cuda {

namespace {

constexpr int kWarps = 4;  // rows per CTA
constexpr int kThreads = 32 * kWarps;

// Element strides of x [B, L, H, D].
struct Strides {
  int64_t batch, token, head, element;
};

template <typename T, int kHeadDim, bool kVector>
__global__ void __launch_bounds__(kThreads)
    norm_rope_kernel(const T* x, const T* weight, const int32_t* offsets, T* out,
                     Strides strides, int L, int H, int64_t rows, float eps, Frequencies freqs) {
  __shared__ float inv_freq[kHeadDim / 2];
  load_frequencies<kHeadDim>(freqs, inv_freq);

  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps: every lane of a warp has the same row
  const int h = static_cast<int>(row % H);
  const int l = static_cast<int>(row / H % L);
  const int64_t b = row / H / L;
  const float position = __fadd_rn(static_cast<float>(l), static_cast<float>(offsets[b]));
  norm_rope_row<T, kHeadDim, kVector>(
      x + b * strides.batch + l * strides.token + h * strides.head, strides.element, weight,
      position, inv_freq, eps, out + ((b * H + h) * L + l) * kHeadDim);
}

// Whether every lane's N elements of every row of x can be read as one aligned access.
template <typename T, int N>
bool vector_loadable(const mx::array& x) {
  if (!is_power_of_two(N) || x.strides(3) != 1) return false;
  const auto address = reinterpret_cast<uintptr_t>(mx::gpu_ptr<void>(x));
  return address % (N * sizeof(T)) == 0 && x.strides(0) % N == 0 && x.strides(1) % N == 0 &&
         x.strides(2) % N == 0;
}

template <typename T, int kHeadDim>
void launch_norm_rope(Encoder& enc, const mx::array& x, const mx::array& weight,
                      const mx::array& offsets, mx::array& out, float eps, Frequencies freqs) {
  constexpr int kPerLane = kHeadDim / 64;
  const T* xs = mx::gpu_ptr<T>(x);
  const T* ws = mx::gpu_ptr<T>(weight);
  const int32_t* positions = mx::gpu_ptr<int32_t>(offsets);
  T* ys = mx::gpu_ptr<T>(out);
  Strides strides{x.strides(0), x.strides(1), x.strides(2), x.strides(3)};
  int L = x.shape(1), H = x.shape(2);
  int64_t rows = static_cast<int64_t>(x.shape(0)) * L * H;
  const dim3 grid(static_cast<unsigned>((rows + kWarps - 1) / kWarps));
  auto add = [&](const void* kernel) {
    const KernelInfo info = kernel_info(enc, kernel, kThreads, 0);
    add_kernel(enc, info, grid, kThreads, 0, xs, ws, positions, ys, strides, L, H, rows, eps,
               freqs);
  };
  if constexpr (is_power_of_two(kPerLane)) {
    if (vector_loadable<T, kPerLane>(x)) {
      return add(reinterpret_cast<const void*>(&norm_rope_kernel<T, kHeadDim, true>));
    }
  }
  add(reinterpret_cast<const void*>(&norm_rope_kernel<T, kHeadDim, false>));
}

}  // namespace

void norm_rope(const mx::array& x, const mx::array& weight, const mx::array& offsets,
               mx::array& out, float eps, const float* inv_freqs, const mx::Stream& s) {
  NvtxRange range("pagekernels::norm_rope");
  const int head_dim = x.shape(3);
  const Frequencies freqs = frequencies("norm_rope", inv_freqs, head_dim);
  auto& enc = mx::cu::get_command_encoder(s);
  out.set_data(mx::allocator::malloc(out.nbytes()));
  enc.set_input_array(x);
  enc.set_input_array(weight);
  enc.set_input_array(offsets);
  enc.set_output_array(out);
  dispatch_float(x.dtype(), "norm_rope", [&](auto tag) {
    using T = decltype(tag);
    dispatch_head_dim(head_dim, [&](auto dim) {
      launch_norm_rope<T, decltype(dim)::value>(enc, x, weight, offsets, out, eps, freqs);
    });
  });
}

}  // namespace pagekernels::cuda
