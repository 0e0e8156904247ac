/* prelude.h (OpenCL): the few words that differ from kernels_cu/prelude.h, so that the
   kernel bodies of kernels_cl/x.cl and kernels_cu/x.cu read the same. Inlined by the
   backend in place of '#include "prelude.h"'; REAL is set by the build options. */
#ifndef REAL
#define REAL float
#endif
#if REAL_IS_DOUBLE
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define REAL_MIN DBL_MIN
#else
#define REAL_MIN FLT_MIN
#endif
typedef REAL real;
#if REAL_IS_DOUBLE
typedef double4 real4;
#else
typedef float4 real4;
#endif

#define KERNEL __kernel
#define GLOBAL __global
#define LOCAL __local
#define LOCAL_PTR __local             /* the address space of a pointer into LOCAL memory */
#define BARRIER() barrier(CLK_LOCAL_MEM_FENCE)
#define GLOBAL_ID(d) ((int)get_global_id(d))
#define LOCAL_ID(d) ((int)get_local_id(d))
#define GROUP_ID(d) ((int)get_group_id(d))
#define RESTRICT restrict
#define DEVICE static            /* a helper function called by kernels */

/* whether x takes best's place in an argmax scan (argmax, maxpool): it is larger, or it
   is the first NaN. NumPy's argmax and max, the reference, rank NaN above every number. */
#define BEATS(x, best) ((best) == (best) && !((x) <= (best)))

/* activation codes, the same in the backends */
#define ACT_LINEAR 0
#define ACT_RELU 1
#define ACT_SIGMOID 2
#define ACT_TANH 3
#define ACT_SOFTMAX 4
#define ACT_LEAKY_RELU 5
#define ACT_ELU 6
#define ACT_GELU 7
#define ACT_SILU 8
