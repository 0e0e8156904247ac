/* mma.cu: GEMM on tensor cores (CUDA only: OpenCL C has no way to them, so this family
   has no body in kernels_cl/). c <- alpha op(a) op(b) + beta c, row-major, as gemm.cl's
   gemm, for a backend computing in TF32 (portanet/precision.py): each input is rounded to
   TF32 (10 bits of mantissa, to nearest, ties to even, as the NumPy reference rounds it),
   products and sums run in float32 (mma.sync m16n8k8, compute capability 8.0 and on).

   A 128 x 128 tile of c per block of 8 warps (2 along m, 4 along n), each warp 64 x 32:
   4 x 4 tiles of 16 x 8, 64 accumulators a thread. K goes in steps of 16 through two
   buffers of shared memory: cp.async copies the next step there while the tensor cores
   work on this one. Operands lie in shared memory as they lie in device memory (a row
   of the stored matrix a row there), so that every copy from device memory is coalesced,
   with pads that keep each warp's fragment reads on 32 different banks; each fragment is
   rounded to TF32 as it is read.

   Compile-time: TRANS_A, TRANS_B (as gemm.cl's); MIN_BLOCKS, the blocks a multiprocessor
   must hold at once (2 caps registers at 128, with a few spilled; 1 lets it take 201);
   VEC, 16-byte copies (where the operands' rows and offsets are whole 4s). */
#ifndef OPERAND_BITS
#define OPERAND_BITS 10         /* prelude.h's operand(): TF32 rounding */
#endif
#include "prelude.h"

#ifndef TRANS_A
#define TRANS_A 0
#endif
#ifndef TRANS_B
#define TRANS_B 0
#endif
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif
#ifndef VEC
#define VEC 0
#endif


#define BM 128
#define BN 128
#define BK 16
#define THREADS 256

/* shared memory: op(a)'s tile (BM x BK) as a[m][k] (k contiguous, pad 4: bank 20 g + t)
   or transposed as a[k][m] (pad 8: bank 8 t + g), likewise op(b)'s (BK x BN) */
#if TRANS_A
#define A_ROWS BK
#define A_COLS (BM + 8)
#define AS(i, kk) tf32_bits(as[(kk) * A_COLS + (i)])
#else
#define A_ROWS BM
#define A_COLS (BK + 4)
#define AS(i, kk) tf32_bits(as[(i) * A_COLS + (kk)])
#endif
#if TRANS_B
#define B_ROWS BN
#define B_COLS (BK + 4)
#define BS(kk, j) tf32_bits(bs[(j) * B_COLS + (kk)])
#else
#define B_ROWS BK
#define B_COLS (BN + 8)
#define BS(kk, j) tf32_bits(bs[(kk) * B_COLS + (j)])
#endif
/* elements of each operand's tile that one thread copies per step (a's tile and b's are
   alike: BM = BN) */
#define LOADS (BM * BK / THREADS)
static_assert(BM == BN && LOADS % 4 == 0, "fetch copies BM x BK and BK x BN tiles alike");

/* x rounded to TF32, to nearest with ties to even (as cuBLAS's TF32 rounds, measured on
   an H100, and the NumPy reference), as the bits mma.sync reads (it ignores the low 13):
   Hopper's cvt.rn, else prelude.h's operand() */
DEVICE unsigned tf32_bits(float x) {
#if __CUDA_ARCH__ >= 900
    unsigned r;
    asm("cvt.rn.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
#else
    return AS_BITS(operand(x));
#endif
}

/* a step's tile of a stored matrix (rows x cols, leading dimension ld) into shared memory
   (`pitch` a row), the tile_rows x tile_cols from (row0, col0), zeros outside: thread t
   copies elements t, t + THREADS, ... (VEC 1: 4 at a time, 16 bytes, where ld and the
   matrix's offset are multiples of 4) in the tile's row-major order, so a warp reads
   along a row. cp.async: the copies run in the background until cp.async.wait_group;
   those that reach past the matrix copy fewer bytes and fill the rest with zeros. */
#define WIDTH (VEC ? 4 : 1)
DEVICE void fetch(float* tile, int pitch, const float* RESTRICT x, int ld, int rows,
                  int cols, int row0, int col0, int tile_cols) {
#pragma unroll
    for (int l = 0; l < LOADS / WIDTH; l++) {
        int e = ((int)threadIdx.x + l * THREADS) * WIDTH;
        int r = row0 + e / tile_cols, c = col0 + e % tile_cols;
        int inside = r < rows ? min(max(cols - c, 0), WIDTH) : 0;
        const float* src = inside ? x + (size_t)r * ld + c : x;
        unsigned dst = (unsigned)__cvta_generic_to_shared(tile + (e / tile_cols) * pitch
                                                          + e % tile_cols);
#if VEC
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                     :: "r"(dst), "l"(src), "r"(4 * inside));
#else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                     :: "r"(dst), "l"(src), "r"(4 * inside));
#endif
    }
}

KERNEL __launch_bounds__(THREADS, MIN_BLOCKS)
void gemm_tf32(GLOBAL real* RESTRICT c, int c_off, int ldc, const GLOBAL real* RESTRICT a,
               int a_off, int lda, const GLOBAL real* RESTRICT b, int b_off, int ldb,
               int m, int n, int k, real alpha, real beta) {
    c += c_off;
    a += a_off;
    b += b_off;
    __shared__ __align__(16) float a_tiles[2][A_ROWS * A_COLS];
    __shared__ __align__(16) float b_tiles[2][B_ROWS * B_COLS];
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = (warp / 4) * 64, wn = (warp % 4) * 32;
    const int g = lane / 4, t = lane % 4;

    float acc[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                acc[i][j][r] = 0.0f;

    /* the step of K from k0 into buffer s: op(a)'s rows m0.., op(b)'s columns n0.., as
       they are stored; then a commit, so that wait_group counts steps */
#define FETCH(s, k0) do { \
        if (TRANS_A) fetch(a_tiles[s], A_COLS, a, lda, k, m, (k0), m0, BM); \
        else fetch(a_tiles[s], A_COLS, a, lda, m, k, m0, (k0), BK); \
        if (TRANS_B) fetch(b_tiles[s], B_COLS, b, ldb, n, k, n0, (k0), BK); \
        else fetch(b_tiles[s], B_COLS, b, ldb, k, n, (k0), n0, BN); } while (0)

    const int steps = (k + BK - 1) / BK;
    FETCH(0, 0);
    asm volatile("cp.async.commit_group;\n" ::);
    for (int step = 0; step < steps; step++) {
        if (step + 1 < steps)
            FETCH((step + 1) % 2, (step + 1) * BK);
        asm volatile("cp.async.commit_group;\n" ::);    /* empty at the last step */
        asm volatile("cp.async.wait_group 1;\n" ::);    /* this step's copies are done */
        __syncthreads();
        const float* as = a_tiles[step % 2];
        const float* bs = b_tiles[step % 2];
#pragma unroll
        for (int kk = 0; kk < BK; kk += 8) {
            unsigned fa[4][4], fb[4][2];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int r = wm + 16 * i + g;
                fa[i][0] = AS(r, kk + t);
                fa[i][1] = AS(r + 8, kk + t);
                fa[i][2] = AS(r, kk + t + 4);
                fa[i][3] = AS(r + 8, kk + t + 4);
            }
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int col = wn + 8 * j + g;
                fb[j][0] = BS(kk + t, col);
                fb[j][1] = BS(kk + t + 4, col);
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    asm volatile(
                        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                        "{%0, %1, %2, %3};\n"
                        : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]),
                          "+f"(acc[i][j][3])
                        : "r"(fa[i][0]), "r"(fa[i][1]), "r"(fa[i][2]), "r"(fa[i][3]),
                          "r"(fb[j][0]), "r"(fb[j][1]));
        }
        __syncthreads();                /* before the step after next fills this buffer */
    }

    /* accumulator r of tile (i, j) is c's (row g + 8 (r / 2), column 2 t + r % 2) in it */
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int row = m0 + wm + 16 * i + g + 8 * (r / 2);
                int col = n0 + wn + 8 * j + 2 * t + r % 2;
                if (row < m && col < n) {
                    real* out = c + (size_t)row * ldc + col;
                    *out = beta == 0 ? alpha * acc[i][j][r] : alpha * acc[i][j][r] + beta * *out;
                }
            }
}
