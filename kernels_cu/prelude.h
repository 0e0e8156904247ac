/* prelude.h (CUDA): the few words that differ from kernels_cl/prelude.h, so that each
   kernel body in kernels_cl/ is CUDA C too. Inlined by the loader (portanet/backends/
   sources.py) in place of the line that includes it when it builds a family for CUDA. */
#ifndef REAL
#define REAL float
#endif
#ifndef INFINITY                    /* NVRTC has no math.h; nvcc's INFINITY is this float */
#define INFINITY __int_as_float(0x7f800000)
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
#define NUM_GROUPS(d) ((int)((d) == 0 ? gridDim.x : (d) == 1 ? gridDim.y : gridDim.z))
#define ATOMIC_MIN(p, v) atomicMin(p, v)     /* on a GLOBAL int */
/* a split K that its last part to finish adds up (gemm.cl, SPLIT_K 2): a fence that makes
   this thread's global writes visible to the device before the count (release), or the
   writes the count saw after it (acquire); the count of a tile's parts done, and its reset
   for the next launch */
#define DEVICE_RELEASE() __threadfence()
#define DEVICE_ACQUIRE() __threadfence()
#define COUNT_DONE(p) atomicAdd(p, 1)
#define COUNT_RESET(p) atomicExch(p, 0)
#define AS_BITS(x) __float_as_uint(x)         /* a float's bits as an unsigned int, and back */
#define AS_FLOAT(u) __uint_as_float(u)
#define RESTRICT __restrict__
#define DEVICE static __device__  /* a helper function called by kernels */
#define MAYBE_UNUSED __attribute__((unused))  /* a helper a kernel may not call */
/* the work-group a kernel is always launched with, so the compiler can plan registers
   (CUDA: and how many of them must fit on a multiprocessor at once) */
#define GROUP_SIZE(x, y, z, groups) __launch_bounds__((x) * (y) * (z), groups)

/* a matrix product's input as a backend of a lower precision multiplies it (float only,
   portanet/precision.py): rounded to OPERAND_BITS bits of mantissa (tf32 and fp16 10, bf16
   7), to nearest with ties to even (as cuBLAS's TF32 and the NumPy reference round), inf
   and NaN as they are; with OPERAND_HALF (fp16) also to IEEE half's range: from 65520 up
   inf, below 2^-14 a multiple of 2^-24. Else OPERAND(x) is the input itself. */
#if OPERAND_BITS
#define OPERAND_DROP (23 - OPERAND_BITS)     /* float32 mantissa bits that go */
DEVICE MAYBE_UNUSED real operand(const real x) {
    const unsigned int u = AS_BITS(x);
    if ((u & 0x7F800000u) == 0x7F800000u) return x;
#if OPERAND_HALF
    const unsigned int mag = u & 0x7FFFFFFFu, sign = u & 0x80000000u;
    if (mag >= 0x477FF000u) return AS_FLOAT(sign | 0x7F800000u);
    if (mag < 0x38800000u) {                    /* half's subnormals: the ulp is 2^-24 */
        const int drop = 126 - (int)(mag >> 23);
        if (drop > 24) return AS_FLOAT(sign);   /* under half of 2^-24: a signed zero */
        const unsigned int m = (mag & 0x7FFFFFu) | 0x800000u;
        const unsigned int q = (m + (1u << (drop - 1)) - 1u + ((m >> drop) & 1u)) >> drop;
        return AS_FLOAT(sign | AS_BITS((real)q * 5.9604644775390625e-8f));
    }
#endif
    const unsigned int tie = 1u << (OPERAND_DROP - 1);      /* half a unit of the result */
    return AS_FLOAT((u + tie - 1u + ((u >> OPERAND_DROP) & 1u)) & ~((tie << 1) - 1u));
}
#define OPERAND(x) operand(x)

/* x's 16 bits as a bf16 or fp16 GEMM input (OPERAND_BITS 7, or OPERAND_HALF): the bits of
   operand(x), which the 16-bit type holds exactly; NaN stays NaN */
#define HALF_OPERANDS (OPERAND_BITS == 7 || OPERAND_HALF)
#if HALF_OPERANDS
DEVICE MAYBE_UNUSED unsigned short half_bits(const real x) {
    const unsigned int u = AS_BITS(operand(x));
    const unsigned int sign = (u >> 16) & 0x8000u, mag = u & 0x7FFFFFFFu;
#if OPERAND_HALF
    if (mag > 0x7F800000u) return (unsigned short)(sign | 0x7E00u);
    if (mag == 0x7F800000u) return (unsigned short)(sign | 0x7C00u);
    if (mag < 0x38800000u)                      /* a subnormal: its multiple of 2^-24 */
        return (unsigned short)(sign | (unsigned int)(AS_FLOAT(mag) * 16777216.0f));
    return (unsigned short)(sign | ((mag - 0x38000000u) >> 13));  /* exponent 127 -> 15 */
#else
    return (unsigned short)(mag > 0x7F800000u ? sign | 0x7FC0u : u >> 16);
#endif
}

/* the value of 16 bits that half_bits stored (16-bit storage: the batch, a Dense's z and a,
   its delta), exactly: bf16 is a float32's upper half; fp16's exponent moves 15 -> 127, its
   subnormals are multiples of 2^-24, inf and NaN stay so */
DEVICE MAYBE_UNUSED real half_value(const unsigned short h) {
#if OPERAND_HALF
    const unsigned int sign = ((unsigned int)h & 0x8000u) << 16;
    const unsigned int e = ((unsigned int)h >> 10) & 0x1Fu, m = (unsigned int)h & 0x3FFu;
    if (e == 0u) return AS_FLOAT(sign | AS_BITS((real)m * 5.9604644775390625e-8f));
    if (e == 31u) return AS_FLOAT(sign | 0x7F800000u | (m << 13));
    return AS_FLOAT(sign | ((e + 112u) << 23) | (m << 13));
#else
    return AS_FLOAT((unsigned int)h << 16);
#endif
}
#endif
#else
#define OPERAND(x) x                  /* (the token itself: fp32 kernels unchanged) */
#endif

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
#define ACT_SIGMOID_OF_A 9          /* derivatives only: f' from a = f(z) (arrays.OF_OUTPUT) */
#define ACT_TANH_OF_A 10

/* the activations, shared by the kernel families that apply them (elementwise, norm);
   the others do not call them, which nvcc would warn of at every build */
#pragma nv_diag_suppress 177
/* tanh, exactly +-1 from where it rounds there (1 - tanh z under half an ulp of 1), as the
   reference's: libraries differ by an ulp there (PoCL's tanh is 1 - 2^-24 even at inf), and
   1 - tanh^2 made of that ulp a derivative of 1.2e-7 or 0, of an inf gradient inf or NaN */
#if REAL_IS_DOUBLE
#define TANH_ONE 19.061547465          /* ln(2^55 - 1) / 2 */
#else
#define TANH_ONE 9.0109134f            /* ln(2^26 - 1) / 2 */
#endif
DEVICE real tanh_rounded(const real z) {
    return fabs(z) > TANH_ONE ? copysign((real)1, z) : tanh(z);     /* NaN: tanh(NaN) */
}

/* leaky_relu's slope for z <= 0 (PyTorch's default); 1 / sqrt 2 and 1 / sqrt(2 pi) for gelu */
#if REAL_IS_DOUBLE
#define LEAKY_SLOPE 0.01
#define SQRT1_2 0.70710678118654752440
#define INV_SQRT_2PI 0.39894228040143267794
#else
#define LEAKY_SLOPE 0.01f
#define SQRT1_2 0.70710678118654752440f
#define INV_SQRT_2PI 0.39894228040143267794f
#endif

DEVICE real sigmoid(const real z) {
    return (real)1 / ((real)1 + exp(-z));
}

/* f(z), in the reference's order of operations (numpy.activate), so that inf and NaN come
   out where the reference's do: gelu(-inf) and silu(-inf) are NaN (-inf . 0), as in PyTorch */
DEVICE real activate(const int kind, const real z) {
    switch (kind) {
    case ACT_RELU: return z < 0 ? (real)0 : z;      /* NaN stays NaN, as in np.maximum */
    case ACT_SIGMOID: return sigmoid(z);
    case ACT_TANH: return tanh_rounded(z);
    case ACT_LEAKY_RELU: return z > 0 ? z : LEAKY_SLOPE * z;
    case ACT_ELU: return z > 0 ? z : expm1(z);
    case ACT_GELU: return (real)0.5 * z * erfc(-z * SQRT1_2);  /* 0.5 z (1 + erf(z / sqrt 2)) */
    case ACT_SILU: return z / ((real)1 + exp(-z));
    default: return z;
    }
}

/* f'(z) for the elementwise activations (softmax is only used fused with its loss), the
   formulas as written: NaN where they multiply inf by 0 (gelu' and silu' at +-inf) */
DEVICE real activate_grad(const int kind, const real z) {
    switch (kind) {
    case ACT_RELU: return z > 0 ? (real)1 : (real)0;
    case ACT_SIGMOID: { const real s = sigmoid(z); return s * ((real)1 - s); }
    case ACT_TANH: { const real t = tanh_rounded(z); return (real)1 - t * t; }
    case ACT_LEAKY_RELU: return z > 0 ? (real)1 : LEAKY_SLOPE;
    case ACT_ELU: return z > 0 ? (real)1 : exp(z);
    case ACT_GELU:                                  /* Phi(z) + z phi(z) */
        return (real)0.5 * erfc(-z * SQRT1_2) + z * exp((real)-0.5 * z * z) * INV_SQRT_2PI;
    case ACT_SILU: { const real s = sigmoid(z); return s * ((real)1 + z * ((real)1 - s)); }
    case ACT_SIGMOID_OF_A: return z * ((real)1 - z);               /* z holds a */
    case ACT_TANH_OF_A: return (real)1 - z * z;
    default: return (real)1;
    }
}
