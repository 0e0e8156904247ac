/* copies.h: h[at] <- x's 16 bits (prelude.h's half_bits) where shadow is set, for the
   kernels that write an array and, where a bf16 or fp16 backend keeps its 16-bit copy for
   the products that read it (shadows.py's keep_operands), that copy beside it: bias_activation,
   activation_grad (elementwise), activation_bias_grad (blas). Nothing in the other
   precisions. Apart from prelude.h so that gemm's source, and with it the tuned parameters
   keyed by its digest (portanet/tuning.py), is not touched by it. */
#if HALF_OPERANDS
#define STORE_HALF(h, at, x, shadow) do { if (shadow) (h)[at] = half_bits(x); } while (0)
#else
#define STORE_HALF(h, at, x, shadow) do { } while (0)
#endif

/* STORED: the type of an array the kernel may write or read in 16-bit storage (a Dense's or
   Conv2D's z and a where another of them reads a, a pool's or Dropout's output between them,
   the batch one reads first: docs/storage16.md);
   built with STORED_HALF its 16 bits (TO_STORED rounds as half_bits, FROM_STORED is
   half_value; OPERAND_STORED reads a product's input, which OPERAND rounds where it is
   real), else real as it is. */
#if STORED_HALF
#define STORED unsigned short
#define TO_STORED(x) half_bits(x)
#define FROM_STORED(h) half_value(h)
#define OPERAND_STORED(h) half_value(h)      /* (a product's input, rounded already) */
#else
#define STORED real
#define TO_STORED(x) (x)
#define FROM_STORED(h) (h)
#define OPERAND_STORED(h) OPERAND(h)
#endif
