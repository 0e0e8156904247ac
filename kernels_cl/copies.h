/* copies.h: h[at] <- x's 16 bits (prelude.h's half_bits) where shadow is set, for the
   kernels that write an array and, where a bf16 or fp16 backend keeps its 16-bit copy for
   the products that read it (gpu.py's keep_operands), that copy beside it: bias_activation,
   activation_grad (elementwise), activation_bias_grad (blas). Nothing in the other
   precisions. Apart from prelude.h so that gemm's source, and with it the tuned parameters
   keyed by its digest (portanet/tuning.py), is not touched by it. */
#if HALF_OPERANDS
#define STORE_HALF(h, at, x, shadow) do { if (shadow) (h)[at] = half_bits(x); } while (0)
#else
#define STORE_HALF(h, at, x, shadow) do { } while (0)
#endif
