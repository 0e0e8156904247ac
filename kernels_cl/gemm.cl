/* gemm.cl: c <- alpha op(a) op(b) + beta c on row-major arrays, op(a): M x K, op(b): K x N.

   Tiled through local memory with register blocking. A work-group computes a TSM x TSN
   tile of c with (TSN/WPTN) x (TSM/WPTM) work-items; each work-item owns WPTM x WPTN
   elements. The K loop walks TSK-deep slabs of op(a) and op(b), staged in local memory
   with zero padding past the edges, so any M, N, K work. Slab k0 + TSK travels from global
   memory into registers while slab k0 is multiplied from local memory, so the global
   latency hides behind the arithmetic.

   Where a work-item's elements lie (MICRO):
     0  strided by the group's size in each direction: scalar local reads on distinct banks
     1  contiguous (rows tm.WPTM + wm), read from local memory as 4-wide vectors
     2  in runs of 4 strided by 4 . group size (rows (wm/4) 4 RTSM + 4 tm + wm%4): 4-wide
        reads in which neighbouring work-items take neighbouring 16 bytes, so a warp's
        read has no bank conflict (MICRO 1 strides them by WPTM words)
   With MICRO 1 or 2, PAD must keep the local rows 16-byte aligned (a multiple of 4).

   VW = 4 loads runs of 4 elements of the operands as one vector where a slab lies inside
   the matrices and the host says they are 16-byte aligned (vec_a, vec_b); edge slabs load
   the same elements one by one. DB = 1 double-buffers the slabs in local memory: one
   barrier per slab instead of two.

   Accurate long sums: the host never gives a work-group more than ACC_K terms of a sum
   (backends/base.py says why): longer products go in split-K parts or in launches over
   pieces of K that add into c. (Adding the accumulators into c every ACC_K terms inside
   the loop kept 50 more registers live on NVIDIA's compilers, c's addresses hoisted.)

   SUBGROUP = 32 (a warp) or 64 (a wavefront) gives each run of that many consecutive
   work-items, which the hardware schedules together, a block of 8 x SUBGROUP/8 positions
   (tn, tm) instead of two rows of the group: their local reads then touch 8 runs of B and
   4 (8) of A, one 128-byte access each, where a 16-wide row reads 16 runs of B.

   MIN_GROUPS: work-groups that must fit on a compute unit at once; CUDA caps the registers
   for it (__launch_bounds__), the OpenCL backend too where the driver takes a cap
   (NVIDIA's -cl-nv-maxrregcount).

   SWIZZLE > 1 hands the work-groups their tiles in bands of SWIZZLE tile rows, a band
   column by column (Triton's grouped order), instead of row by row: the groups that run at
   once then share fewer panels of a and b, which stay in the L2 cache.

   With SPLIT_K=1, work-groups along dimension 2 each take k_chunk of the K sum, from
   k_chunk . GROUP_ID(2), and write their partial product to c + GROUP_ID(2) . M . N (the
   blas family's gemm_split_sum adds the parts pairwise). A variant of its own: the bounds
   cost a register, and one more than 128 halves the work-groups per SM of CUDA's tiling.
   SPLIT_K=2 adds the parts up in the same launch: each writes its partial product to
   ws + GROUP_ID(2) . M . N and counts itself done in counts[tile]; the tile's last part
   to be done adds them all up in the order of the parts (its own read back), writes c
   with the epilogue and resets the count to 0 for the next launch. The sum launch it
   saves is 6-10 us on NVIDIA's OpenCL. (prelude.h's fences order the writes.)

   CONV > 0 makes the kernel an implicit-GEMM convolution (cuDNN's IMPLICIT_GEMM): an
   operand is gathered from images inside the K loop instead of read from a matrix, so no
   patch matrix is ever made. Images are C x H x W x NB, batch innermost (conv.cl's layout);
   CONV_K, CONV_S and CONV_P are the kernel size, stride and padding, the image sizes are
   arguments, and every K index is offset by k_base (a launch over a later piece of K):
     1  forward      c (F x Ho.Wo.NB) = w (F x C.k.k) . cols(x), op(b) gathered from x;
                     with BIAS_ACT = 1 the epilogue also adds bias[i] and writes
                     act <- f(c) for the activation `kind` (bias_activation fused)
     2  input grad   c (C x H.W.NB) = w' (C x F.k.k) . dz', both gathered: w' reads w's
                     (c, ki, kj) column of each filter f; row (f, ki, kj) of pixel (h, w, n)
                     in dz' is dz[f, oh, ow, n] where oh s = h + p - ki, ow s = w + p - kj,
                     else 0 (the adjoint of the forward's gather, col2im fused)
     3  weight grad  c (F x C.k.k) = dz (F x Ho.Wo.NB) . cols(x)^T, op(b) gathered from x
   Gathered patches load as runs of VW samples of one pixel where the host says the batch
   and the images' offset are multiples of VW (vec_b), else element by element, as the
   input gradient's gathers always do; CONV_FIXED compiles the image sizes in.

   Compile-time parameters (build options): TRANS_A, TRANS_B, TSM, TSN, TSK, WPTM, WPTN,
   MICRO, PAD, VW, DB, SUBGROUP, MIN_GROUPS, SWIZZLE, SPLIT_K; CONV, CONV_K, CONV_S, CONV_P,
   BIAS_ACT, CONV_FIXED and the sizes it takes. */
#include "prelude.h"

#ifndef TSM
#define TSM 64
#endif
#ifndef TSN
#define TSN 64
#endif
#ifndef TSK
#define TSK 16
#endif
#ifndef WPTM
#define WPTM 4
#endif
#ifndef WPTN
#define WPTN 4
#endif
#ifndef MICRO
#define MICRO 0
#endif
#ifndef PAD
#define PAD 1
#endif
#ifndef VW
#define VW 1
#endif
#ifndef DB
#define DB 0
#endif
#ifndef MIN_GROUPS
#define MIN_GROUPS 1
#endif
#ifndef SUBGROUP
#define SUBGROUP 0
#endif
#ifndef SPLIT_K
#define SPLIT_K 0
#endif
#ifndef SWIZZLE
#define SWIZZLE 1
#endif
#define RTSM (TSM / WPTM)            /* work-items along M */
#define RTSN (TSN / WPTN)            /* work-items along N */
#define THREADS (RTSM * RTSN)
#define STAGES (DB ? 2 : 1)
#if MICRO == 1                       /* row (col) of a work-item's wm-th (wn-th) element */
#define ROW(tm, wm) ((tm) * WPTM + (wm))
#define COL(tn, wn) ((tn) * WPTN + (wn))
#elif MICRO == 2
#define ROW(tm, wm) ((wm) / 4 * 4 * RTSM + (tm) * 4 + (wm) % 4)
#define COL(tn, wn) ((wn) / 4 * 4 * RTSN + (tn) * 4 + (wn) % 4)
#else
#define ROW(tm, wm) ((tm) + (wm) * RTSM)
#define COL(tn, wn) ((tn) + (wn) * RTSN)
#endif

/* 16-bit operands (A_HALF, B_HALF: an array in bf16's or fp16's 16-bit storage,
   portanet/precision.py): their elements are half_bits' 16 bits, loaded as they are (a run
   of VW as one 8-byte load) into the registers that hold the next slab, and read as
   prelude.h's half_value reads them only when stored into the local slab (A_SLAB, B_SLAB):
   a conversion at the load would wait for the load there, which the slab's products hide
   otherwise (a convolution's input gradient took 1.84 ms against float32's 1.27 on an
   H100). Rounded already, they skip OPERAND's rounding, which the slab's real inputs take. */
#if VW == 4
#define LOAD_RUN16(r, p) { const ushort4 u_ = *(const GLOBAL ushort4*)(p); \
    r[0] = u_.x; r[1] = u_.y; r[2] = u_.z; r[3] = u_.w; }
#else
#define LOAD_RUN16(r, p) r[0] = *(p)
#endif
#if A_HALF
#define A_TYPE unsigned short
#define A_LOAD_RUN(r, p) LOAD_RUN16(r, p)
#define A_SLAB(x) half_value(x)
#else
#define A_TYPE real
#define A_LOAD_RUN(r, p) LOAD_RUN(r, p)
#define A_SLAB(x) OPERAND(x)
#endif
#if B_HALF
#define B_TYPE unsigned short
#define B_LOAD_RUN(r, p) LOAD_RUN16(r, p)
#define B_SLAB(x) half_value(x)
#else
#define B_TYPE real
#define B_LOAD_RUN(r, p) LOAD_RUN(r, p)
#define B_SLAB(x) OPERAND(x)
#endif

/* element (row, col) of op(x) for a row-major x with leading dimension ld */
#if !CONV
#if TRANS_A
#define A_AT(i, k) a[a_off + (k) * lda + (i)]
#else
#define A_AT(i, k) a[a_off + (i) * lda + (k)]
#endif
#if TRANS_B
#define B_AT(k, j) b[b_off + (j) * ldb + (k)]
#else
#define B_AT(k, j) b[b_off + (k) * ldb + (j)]
#endif
#else
#define KK (CONV_K * CONV_K)
/* cols(x)[r, col]: pixel (oh s - p + ki, ow s - p + kj) of channel c of sample n, 0 in the
   padding, for row r = (c, ki, kj) and column col = (oh, ow, n); as stored (B_SLAB reads
   it), 0 being zero's bits in 16 bits too */
DEVICE B_TYPE patch(const GLOBAL B_TYPE* RESTRICT x, const int x_off, const int r,
                    const int col, const int H, const int W, const int NB, const int WO) {
    const int c = r / KK, ki = r / CONV_K % CONV_K, kj = r % CONV_K;
    const int n = col % NB, q = col / NB;
    const int h = q / WO * CONV_S - CONV_P + ki, w = q % WO * CONV_S - CONV_P + kj;
    return (h >= 0 && h < H && w >= 0 && w < W) ? x[x_off + ((c * H + h) * W + w) * NB + n]
                                                : (B_TYPE)0;
}
/* out[0 .. VW) <- cols(x)[r, col .. col + VW): where NB and col are multiples of VW, the
   same pixel of VW consecutive samples, so one bounds check and one vector load */
#define PATCH_RUN(out, x, x_off, r, col, H, W, NB, WO) { \
    const int c_ = (r) / KK, ki_ = (r) / CONV_K % CONV_K, kj_ = (r) % CONV_K; \
    const int n_ = (col) % (NB), q_ = (col) / (NB); \
    const int h_ = q_ / (WO) * CONV_S - CONV_P + ki_, w_ = q_ % (WO) * CONV_S - CONV_P + kj_; \
    if (h_ >= 0 && h_ < (H) && w_ >= 0 && w_ < (W)) { \
        B_LOAD_RUN(out, &x[(x_off) + ((c_ * (H) + h_) * (W) + w_) * (NB) + n_]); \
    } else { \
        for (int v_ = 0; v_ < VW; ++v_) out[v_] = (B_TYPE)0; \
    } }
/* dz'[r, col] for row r = (f, ki, kj) and pixel col = (h, w, n): the output (oh, ow) whose
   patch holds the pixel at (ki, kj), if there is one; as stored, as patch */
DEVICE B_TYPE spread(const GLOBAL B_TYPE* RESTRICT dz, const int dz_off, const int r,
                     const int col, const int W, const int NB, const int HO, const int WO) {
    const int f = r / KK, ki = r / CONV_K % CONV_K, kj = r % CONV_K;
    const int n = col % NB, q = col / NB;
    const int hs = q / W + CONV_P - ki, ws = q % W + CONV_P - kj;     /* oh s, ow s */
    const int oh = hs / CONV_S, ow = ws / CONV_S;
    return (hs >= 0 && ws >= 0 && oh * CONV_S == hs && ow * CONV_S == ws && oh < HO && ow < WO)
               ? dz[dz_off + ((f * HO + oh) * WO + ow) * NB + n] : (B_TYPE)0;
}
/* the image sizes: kernel arguments, or with CONV_FIXED compiled in (CONV_C, CONV_H,
   CONV_W, CONV_NB, CONV_HO, CONV_WO), so that the gathers divide by constants */
#if CONV_FIXED
#define G_C CONV_C
#define G_H CONV_H
#define G_W CONV_W
#define G_NB CONV_NB
#define G_HO CONV_HO
#define G_WO CONV_WO
#else
#define G_C C
#define G_H H
#define G_W W
#define G_NB NB
#define G_HO HO
#define G_WO WO
#endif
#if CONV == 1
#define A_AT(i, k) a[a_off + (i) * lda + (k) + k_base]
#define B_AT(k, j) patch(b, b_off, (k) + k_base, j, G_H, G_W, G_NB, G_WO)
#define B_RUN_AT(out, k, j) PATCH_RUN(out, b, b_off, (k) + k_base, j, G_H, G_W, G_NB, G_WO)
#elif CONV == 2
#define A_AT(i, k) a[a_off + (((k) + k_base) / KK * G_C + (i)) * KK + ((k) + k_base) % KK]
#define B_AT(k, j) spread(b, b_off, (k) + k_base, j, G_W, G_NB, G_HO, G_WO)
#else
#define A_AT(i, k) a[a_off + (i) * lda + (k) + k_base]
#define B_AT(k, j) patch(b, b_off, j, (k) + k_base, G_H, G_W, G_NB, G_WO)
#define B_RUN_AT(out, k, j) PATCH_RUN(out, b, b_off, j, (k) + k_base, G_H, G_W, G_NB, G_WO)
#endif
#endif

/* the e-th run of VW elements a work-group loads from a slab starts at (i, k) of the A slab,
   (k, j) of the B slab; a run goes along the operand's rows in memory (k for a, j for b
   untransposed), consecutive work-items take consecutive runs, and its v-th element is
   (ie, ke) of the A slab, (ke, je) of the B slab */
#if TRANS_A
#define A_RUN(e, i, k) const int i = (e) % (TSM / VW) * VW, k = (e) / (TSM / VW)
#define A_ELEMENT(i, k, v, ie, ke) const int ie = (i) + (v), ke = (k)
#else
#define A_RUN(e, i, k) const int k = (e) % (TSK / VW) * VW, i = (e) / (TSK / VW)
#define A_ELEMENT(i, k, v, ie, ke) const int ie = (i), ke = (k) + (v)
#endif
#if TRANS_B
#define B_RUN(e, k, j) const int k = (e) % (TSK / VW) * VW, j = (e) / (TSK / VW)
#define B_ELEMENT(k, j, v, ke, je) const int ke = (k) + (v), je = (j)
#else
#define B_RUN(e, k, j) const int j = (e) % (TSN / VW) * VW, k = (e) / (TSN / VW)
#define B_ELEMENT(k, j, v, ke, je) const int ke = (k), je = (j) + (v)
#endif
#define A_LOADS (TSM * TSK / (THREADS * VW))   /* runs per work-item per slab */
#define B_LOADS (TSN * TSK / (THREADS * VW))
#if A_LOADS * THREADS * VW != TSM * TSK || B_LOADS * THREADS * VW != TSN * TSK
#error "TSM * TSK and TSN * TSK must be multiples of the work-group size times VW"
#endif

/* r[0 .. VW) <- the VW elements from p on, as one load (p 16-byte aligned for VW = 4) */
#if VW == 4
#define LOAD_RUN(r, p) { const real4 x_ = *(const GLOBAL real4*)(p); \
    r[0] = x_.x; r[1] = x_.y; r[2] = x_.z; r[3] = x_.w; }
#elif VW == 1
#define LOAD_RUN(r, p) r[0] = *(p)
#else
#error "VW must be 1 or 4"
#endif

/* local slabs: as[stage][k][i] and bs[stage][k][j], rows TSM + PAD (TSN + PAD) long,
   declared as real4 so that 4-wide reads of them are aligned */
#define AS(s, k, i) as[((s) * TSK + (k)) * (TSM + PAD) + (i)]
#define BS(s, k, j) bs[((s) * TSK + (k)) * (TSN + PAD) + (j)]

KERNEL GROUP_SIZE(RTSN, RTSM, 1, MIN_GROUPS)
void gemm(GLOBAL real* c, const int c_off, const GLOBAL A_TYPE* RESTRICT a, const int a_off,
          const GLOBAL B_TYPE* RESTRICT b, const int b_off, const real alpha, const real beta,
          const int M, const int N, const int K, const int lda, const int ldb,
          const int k_chunk, const int vec_a, const int vec_b
#if CONV
          , const int C, const int H, const int W, const int NB, const int HO, const int WO,
          const int k_base
#endif
#if BIAS_ACT
          , GLOBAL real* act, const int act_off, const GLOBAL real* bias, const int bias_off,
          const int kind
#endif
#if SPLIT_K == 2
          , GLOBAL real* ws, const int ws_off, GLOBAL int* counts, const int counts_off
#endif
          ) {
    LOCAL real4 as4[(STAGES * TSK * (TSM + PAD) + 3) / 4];
    LOCAL real4 bs4[(STAGES * TSK * (TSN + PAD) + 3) / 4];
    LOCAL_PTR real* as = (LOCAL_PTR real*)as4;
    LOCAL_PTR real* bs = (LOCAL_PTR real*)bs4;
#if SPLIT_K == 2
    LOCAL int last;                              /* whether this group is its tile's last */
#endif
    const int tid = LOCAL_ID(1) * RTSN + LOCAL_ID(0);   /* loads: consecutive runs */
#if SUBGROUP        /* each SUBGROUP of consecutive work-items a block 8 wide along N */
    const int lane = tid % SUBGROUP, sg = tid / SUBGROUP;
    const int tn = sg % (RTSN / 8) * 8 + lane % 8;
    const int tm = sg / (RTSN / 8) * (SUBGROUP / 8) + lane / 8;
#else
    const int tn = LOCAL_ID(0), tm = LOCAL_ID(1);
#endif
#if SWIZZLE > 1     /* bands of SWIZZLE tile rows, each walked column by column */
    const int groups_n = NUM_GROUPS(0), id = GROUP_ID(1) * groups_n + GROUP_ID(0);
    const int band = id / (SWIZZLE * groups_n), in_band = id - band * SWIZZLE * groups_n;
    const int rows = min(NUM_GROUPS(1) - band * SWIZZLE, SWIZZLE);
    const int m0 = (band * SWIZZLE + in_band % rows) * TSM, n0 = in_band / rows * TSN;
#else
    const int m0 = GROUP_ID(1) * TSM, n0 = GROUP_ID(0) * TSN;
#endif
#if SPLIT_K
    const int k_begin = GROUP_ID(2) * k_chunk;
    const int k_end = min(K, k_begin + k_chunk);
#if SPLIT_K == 1
    const int c_part = GROUP_ID(2) * M * N;
#else
    const int c_part = 0;                        /* (SPLIT_K 2: the parts into ws) */
#endif
#else
    const int k_begin = 0;
    const int k_end = K;
    const int c_part = 0;
#endif

    real acc[WPTM][WPTN];
#pragma unroll
    for (int wm = 0; wm < WPTM; ++wm)
#pragma unroll
        for (int wn = 0; wn < WPTN; ++wn) acc[wm][wn] = 0;

    /* the first pass (k0 = k_begin - TSK) only loads and stores the first slab */
#if A_HALF || B_HALF
    A_TYPE a_next[A_LOADS][VW];                  /* (16-bit operands: as stored) */
    B_TYPE b_next[B_LOADS][VW];
#else
    real a_next[A_LOADS][VW], b_next[B_LOADS][VW];
#endif
    int s = 0;                                   /* the stage being multiplied */
    for (int k0 = k_begin - TSK; k0 < k_end; k0 += TSK) {
        const int k1 = k0 + TSK, more = k1 < k_end;
        if (more) {                              /* slab k1 into registers */
            const int inside = k1 + TSK <= k_end;
#pragma unroll
            for (int l = 0; l < A_LOADS; ++l) {
                A_RUN(tid + l * THREADS, i, k);
#if CONV != 2                            /* (a gathered operand loads one by one) */
                if (vec_a && inside && m0 + TSM <= M) {
                    A_LOAD_RUN(a_next[l], &A_AT(m0 + i, k1 + k));
                } else
#endif
                {
#pragma unroll
                    for (int v = 0; v < VW; ++v) {
                        A_ELEMENT(i, k, v, ie, ke);
                        a_next[l][v] = (m0 + ie < M && k1 + ke < k_end)
                                           ? A_AT(m0 + ie, k1 + ke) : (A_TYPE)0;
                    }
                }
            }
#pragma unroll
            for (int l = 0; l < B_LOADS; ++l) {
                B_RUN(tid + l * THREADS, k, j);
#if !CONV
                if (vec_b && inside && n0 + TSN <= N) {
                    B_LOAD_RUN(b_next[l], &B_AT(k1 + k, n0 + j));
                } else
#elif CONV != 2 && VW > 1                /* runs of samples of one pixel */
                if (vec_b && inside && n0 + TSN <= N) {
                    B_RUN_AT(b_next[l], k1 + k, n0 + j);
                } else
#endif
                {
#pragma unroll
                    for (int v = 0; v < VW; ++v) {
                        B_ELEMENT(k, j, v, ke, je);
                        b_next[l][v] = (k1 + ke < k_end && n0 + je < N)
                                           ? B_AT(k1 + ke, n0 + je) : (B_TYPE)0;
                    }
                }
            }
        }
        if (k0 >= k_begin) {                     /* slab k0, from local stage s */
#pragma unroll
            for (int k = 0; k < TSK; ++k) {
                real ar[WPTM], br[WPTN];
#if MICRO
#pragma unroll
                for (int v = 0; v < WPTM; v += 4) {
                    const real4 x = *(const LOCAL_PTR real4*)&AS(s, k, ROW(tm, v));
                    ar[v] = x.x; ar[v + 1] = x.y; ar[v + 2] = x.z; ar[v + 3] = x.w;
                }
#pragma unroll
                for (int v = 0; v < WPTN; v += 4) {
                    const real4 x = *(const LOCAL_PTR real4*)&BS(s, k, COL(tn, v));
                    br[v] = x.x; br[v + 1] = x.y; br[v + 2] = x.z; br[v + 3] = x.w;
                }
#else
#pragma unroll
                for (int wm = 0; wm < WPTM; ++wm) ar[wm] = AS(s, k, ROW(tm, wm));
#pragma unroll
                for (int wn = 0; wn < WPTN; ++wn) br[wn] = BS(s, k, COL(tn, wn));
#endif
#pragma unroll
                for (int wm = 0; wm < WPTM; ++wm)
#pragma unroll
                    for (int wn = 0; wn < WPTN; ++wn) acc[wm][wn] += ar[wm] * br[wn];
            }
        }
        if (more) {                              /* registers into the next stage */
#if !DB
            BARRIER();                           /* every work-item is done with stage 0 */
#endif
            s = DB ? 1 - s : 0;
#pragma unroll
            for (int l = 0; l < A_LOADS; ++l) {
                A_RUN(tid + l * THREADS, i, k);
#pragma unroll
                for (int v = 0; v < VW; ++v) {
                    A_ELEMENT(i, k, v, ie, ke);
                    AS(s, ke, ie) = A_SLAB(a_next[l][v]);
                }
            }
#pragma unroll
            for (int l = 0; l < B_LOADS; ++l) {
                B_RUN(tid + l * THREADS, k, j);
#pragma unroll
                for (int v = 0; v < VW; ++v) {
                    B_ELEMENT(k, j, v, ke, je);
                    BS(s, ke, je) = B_SLAB(b_next[l][v]);
                }
            }
            BARRIER();
        }
    }

#if SPLIT_K == 2      /* this part into ws; the tile's last part adds them up into acc */
    const int part = GROUP_ID(2) * M * N;
#pragma unroll
    for (int wm = 0; wm < WPTM; ++wm)
#pragma unroll
        for (int wn = 0; wn < WPTN; ++wn) {
            const int i = m0 + ROW(tm, wm), j = n0 + COL(tn, wn);
            if (i < M && j < N) ws[ws_off + part + i * N + j] = acc[wm][wn];
        }
    DEVICE_RELEASE();
    BARRIER();
    GLOBAL int* count = &counts[counts_off + GROUP_ID(1) * NUM_GROUPS(0) + GROUP_ID(0)];
    if (tid == 0) last = COUNT_DONE(count) == NUM_GROUPS(2) - 1;
    BARRIER();
    if (!last) return;
    DEVICE_ACQUIRE();
    if (tid == 0) COUNT_RESET(count);
#pragma unroll
    for (int wm = 0; wm < WPTM; ++wm)
#pragma unroll
        for (int wn = 0; wn < WPTN; ++wn) acc[wm][wn] = 0;
    for (int p = 0; p < NUM_GROUPS(2); ++p) {  /* in the parts' order, its own read back */
#pragma unroll
        for (int wm = 0; wm < WPTM; ++wm)
#pragma unroll
            for (int wn = 0; wn < WPTN; ++wn) {
                const int i = m0 + ROW(tm, wm), j = n0 + COL(tn, wn);
                if (i < M && j < N) acc[wm][wn] += ws[ws_off + p * M * N + i * N + j];
            }
    }
#endif
#pragma unroll
    for (int wm = 0; wm < WPTM; ++wm) {
        const int i = m0 + ROW(tm, wm);
#pragma unroll
        for (int wn = 0; wn < WPTN; ++wn) {
            const int j = n0 + COL(tn, wn);
            if (i < M && j < N) {
                GLOBAL real* cij = &c[c_off + c_part + i * N + j];
#if BIAS_ACT                            /* z <- alpha acc + b; a <- f(z) (a may be z) */
                const real z = alpha * acc[wm][wn] + bias[bias_off + i];
                *cij = z;
                act[act_off + i * N + j] = activate(kind, z);
#else
                *cij = alpha * acc[wm][wn] + (beta == (real)0 ? (real)0 : beta * *cij);
#endif
            }
        }
    }
}
