/* prelude.h (CUDA): the few words that differ from kernels_cl/prelude.h, so that the
   kernel bodies of kernels_cl/x.cl and kernels_cu/x.cu read the same. */
#ifndef REAL
#define REAL float
#endif
#if REAL_IS_DOUBLE
#define REAL_MIN 2.2250738585072014e-308
#else
#define REAL_MIN 1.175494351e-38f
#endif
typedef REAL real;
#if REAL_IS_DOUBLE
typedef double4_32a real4;          /* CUDA 13 names the 32-byte-aligned double4 so */
#else
typedef float4 real4;
#endif

#define KERNEL extern "C" __global__
#define GLOBAL
#define LOCAL __shared__
#define LOCAL_PTR                     /* the address space of a pointer into LOCAL memory */
#define BARRIER() __syncthreads()
#define GLOBAL_ID(d) ((int)((d) == 0 ? blockIdx.x * blockDim.x + threadIdx.x \
                           : (d) == 1 ? blockIdx.y * blockDim.y + threadIdx.y \
                                      : blockIdx.z * blockDim.z + threadIdx.z))
#define LOCAL_ID(d) ((int)((d) == 0 ? threadIdx.x : (d) == 1 ? threadIdx.y : threadIdx.z))
#define GROUP_ID(d) ((int)((d) == 0 ? blockIdx.x : (d) == 1 ? blockIdx.y : blockIdx.z))
#define RESTRICT __restrict__
#define DEVICE static __device__  /* a helper function called by kernels */

/* whether x takes best's place in an argmax scan (argmax, maxpool): it is larger, or it
   is the first NaN. NumPy's argmax and max, the reference, rank NaN above every number. */
#define BEATS(x, best) ((best) == (best) && !((x) <= (best)))

#define ACT_LINEAR 0
#define ACT_RELU 1
#define ACT_SIGMOID 2
#define ACT_TANH 3
#define ACT_SOFTMAX 4
#define ACT_LEAKY_RELU 5
#define ACT_ELU 6
#define ACT_GELU 7
#define ACT_SILU 8
