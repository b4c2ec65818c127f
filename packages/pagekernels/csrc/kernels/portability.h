// Macros that let one header serve the C++ (CPU) and CUDA kernels.
#pragma once

#if defined(__CUDACC__)
#define PK_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define PK_HOST_DEVICE inline
#endif
