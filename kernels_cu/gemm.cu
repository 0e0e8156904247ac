/* gemm.cu: c <- alpha op(a) op(b) + beta c on row-major arrays, op(a): M x K, op(b): K x N.

   Tiled through local memory with register blocking. A work-group computes a TSM x TSN
   tile of c with (TSN/WPTN) x (TSM/WPTM) work-items; each work-item owns WPTM x WPTN
   elements, strided by the group's size in each direction so that its local-memory reads
   hit distinct banks and its stores coalesce. The K loop walks TSK-deep slabs of op(a)
   and op(b), staged in local memory with zero padding past the edges, so any M, N, K work.

   With MICRO=1 a work-item's elements are contiguous instead (rows tm.WPTM + wm), and it
   reads them from local memory as 4-wide vectors: a third of the local-memory traffic of
   the strided layout. PAD must then keep the local rows 16-byte aligned (a multiple of 4).

   With SPLIT_K=1, work-groups along dimension 2 each take k_chunk of the K sum, from
   k_chunk . GROUP_ID(2), and write their partial product to c + GROUP_ID(2) . M . N
   (gemm_split_sum in blas.cl adds the parts). A variant of its own: the bounds cost a
   register, and one more than 128 halves the work-groups per SM of CUDA's default tiling.

   Compile-time parameters (build options): TRANS_A, TRANS_B, TSM, TSN, TSK, WPTM, WPTN,
   MICRO, PAD, SPLIT_K. */
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
#ifndef SPLIT_K
#define SPLIT_K 0
#endif
#define RTSM (TSM / WPTM)            /* work-items along M */
#define RTSN (TSN / WPTN)            /* work-items along N */
#define THREADS (RTSM * RTSN)
#if MICRO                            /* row (col) of a work-item's wm-th (wn-th) element */
#define ROW(tm, wm) ((tm) * WPTM + (wm))
#define COL(tn, wn) ((tn) * WPTN + (wn))
#else
#define ROW(tm, wm) ((tm) + (wm) * RTSM)
#define COL(tn, wn) ((tn) + (wn) * RTSN)
#endif

/* element (row, col) of op(x) for a row-major x with leading dimension ld */
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

/* which element (i, k) of the A slab (k, j) of the B slab the e-th load of a work-group
   fetches: consecutive work-items read consecutive addresses */
#if TRANS_A
#define A_SLAB(e, i, k) const int i = (e) % TSM, k = (e) / TSM
#else
#define A_SLAB(e, i, k) const int k = (e) % TSK, i = (e) / TSK
#endif
#if TRANS_B
#define B_SLAB(e, k, j) const int k = (e) % TSK, j = (e) / TSK
#else
#define B_SLAB(e, k, j) const int j = (e) % TSN, k = (e) / TSN
#endif
#define A_LOADS (TSM * TSK / THREADS)   /* loads per work-item per slab */
#define B_LOADS (TSN * TSK / THREADS)
#if A_LOADS * THREADS != TSM * TSK || B_LOADS * THREADS != TSN * TSK
#error "TSM * TSK and TSN * TSK must be multiples of the work-group size"
#endif

KERNEL void gemm(GLOBAL real* c, const int c_off, const GLOBAL real* RESTRICT a, const int a_off,
                 const GLOBAL real* RESTRICT b, const int b_off, const real alpha, const real beta,
                 const int M, const int N, const int K, const int lda, const int ldb,
                 const int k_chunk) {
    LOCAL real as[TSK][TSM + PAD];
    LOCAL real bs[TSK][TSN + PAD];
    const int tn = LOCAL_ID(0), tm = LOCAL_ID(1);
    const int tid = tm * RTSN + tn;
    const int m0 = GROUP_ID(1) * TSM, n0 = GROUP_ID(0) * TSN;
#if SPLIT_K
    const int k_begin = GROUP_ID(2) * k_chunk;
    const int k_end = min(K, k_begin + k_chunk);
    const int c_part = GROUP_ID(2) * M * N;
#else
#define k_begin 0
#define k_end K
#define c_part 0
#endif

    real acc[WPTM][WPTN];
#pragma unroll
    for (int wm = 0; wm < WPTM; ++wm)
#pragma unroll
        for (int wn = 0; wn < WPTN; ++wn) acc[wm][wn] = 0;

    /* slab k0 travels from global memory into registers while slab k0 - TSK is multiplied
       from local memory (prefetching: the global latency hides behind the arithmetic) */
    real a_next[A_LOADS], b_next[B_LOADS];
    for (int k0 = k_begin; k0 < k_end + TSK; k0 += TSK) {
        if (k0 < k_end) {                        /* zero padding past the edges */
#pragma unroll
            for (int l = 0; l < A_LOADS; ++l) {
                A_SLAB(tid + l * THREADS, i, k);
                a_next[l] = (m0 + i < M && k0 + k < k_end) ? A_AT(m0 + i, k0 + k) : (real)0;
            }
#pragma unroll
            for (int l = 0; l < B_LOADS; ++l) {
                B_SLAB(tid + l * THREADS, k, j);
                b_next[l] = (k0 + k < k_end && n0 + j < N) ? B_AT(k0 + k, n0 + j) : (real)0;
            }
        }
        if (k0 > k_begin) {
#pragma unroll
            for (int k = 0; k < TSK; ++k) {
                real ar[WPTM], br[WPTN];
#if MICRO
#pragma unroll
                for (int v = 0; v < WPTM; v += 4) {
                    const real4 x = *(const LOCAL_PTR real4*)&as[k][ROW(tm, v)];
                    ar[v] = x.x; ar[v + 1] = x.y; ar[v + 2] = x.z; ar[v + 3] = x.w;
                }
#pragma unroll
                for (int v = 0; v < WPTN; v += 4) {
                    const real4 x = *(const LOCAL_PTR real4*)&bs[k][COL(tn, v)];
                    br[v] = x.x; br[v + 1] = x.y; br[v + 2] = x.z; br[v + 3] = x.w;
                }
#else
#pragma unroll
                for (int wm = 0; wm < WPTM; ++wm) ar[wm] = as[k][ROW(tm, wm)];
#pragma unroll
                for (int wn = 0; wn < WPTN; ++wn) br[wn] = bs[k][COL(tn, wn)];
#endif
#pragma unroll
                for (int wm = 0; wm < WPTM; ++wm)
#pragma unroll
                    for (int wn = 0; wn < WPTN; ++wn) acc[wm][wn] += ar[wm] * br[wn];
            }
            BARRIER();
        }
        if (k0 < k_end) {
#pragma unroll
            for (int l = 0; l < A_LOADS; ++l) {
                A_SLAB(tid + l * THREADS, i, k);
                as[k][i] = a_next[l];
            }
#pragma unroll
            for (int l = 0; l < B_LOADS; ++l) {
                B_SLAB(tid + l * THREADS, k, j);
                bs[k][j] = b_next[l];
            }
            BARRIER();
        }
    }

#pragma unroll
    for (int wm = 0; wm < WPTM; ++wm) {
        const int i = m0 + ROW(tm, wm);
#pragma unroll
        for (int wn = 0; wn < WPTN; ++wn) {
            const int j = n0 + COL(tn, wn);
            if (i < M && j < N) {
                GLOBAL real* cij = &c[c_off + c_part + i * N + j];
                *cij = alpha * acc[wm][wn] + (beta == (real)0 ? (real)0 : beta * *cij);
            }
        }
    }
}
