/* wgmma.cu: GEMM on Hopper's tensor cores from 16-bit inputs (CUDA only, compute capability
   9.0 built as sm_90a: warpgroup MMA has no OpenCL form, so this family has no body in
   kernels_cl/). For a backend computing in bf16 or fp16 (portanet/precision.py):
   c <- alpha op(a) op(b) + beta c, c float32 and row-major, the products summed in float32.

   kmajor16 first writes each operand as the tensor cores read it: op(a) as m rows of k and
   op(b) as n rows of k ("K-major"), each input rounded to 16 bits as prelude.h's half_bits
   rounds it (the NumPy reference's round_to). K must be a multiple of 8: the tensor memory
   accelerator (TMA) takes rows at whole 16 bytes.

   gemm_wgmma: a 128 x 256 tile of c per block of three warpgroups (384 threads). The first
   is the producer: one thread has the TMA copy each 64-wide step of K of both operands'
   tiles (128 x 64 and 256 x 64, 48 KiB) into one of STAGES buffers of shared memory, laid
   out in the 128-byte swizzle the tensor cores read without bank conflicts, and the copy
   engine signals the stage's `full` barrier when its bytes are in. The other two are the
   consumers: each multiplies its 64 rows of a's tile by b's whole tile
   (wgmma m64n256k16, four to a step), 128 float32 sums a thread in registers, and then
   signals the stage's `empty` barrier once the step after it is under way, which the
   producer waits on before it fills the stage again. Blocks take their tiles in groups
   down m (GROUP_M), so that those running at once share their tiles of a and b in L2. TMA
   fills what lies beyond the matrices with zeros, so partial tiles of m, n and k need no
   code; the epilogue writes only c's own elements. The dynamic shared memory a block needs
   (cuda.py's WGMMA_SHARED): the stages, 1024 bytes to align them, and the barriers. */
#include "prelude.h"

#define BM 128                  /* the block's tile of c: BM x BN, K in steps of BK */
#define BN 256
#define BK 64                   /* 64 16-bit inputs: one 128-byte row of the swizzle */
#define STAGES 4
#ifndef GROUP_M
#define GROUP_M 16              /* tiles of m that the blocks run at a time share (L2) */
#endif
#define THREADS 384             /* a producer warpgroup and two consumers */
#define A_STAGE (BM * BK * 2)   /* bytes of a stage's tile of a, and of b */
#define B_STAGE (BN * BK * 2)

#if OPERAND_HALF
#define WGMMA_TYPES "f32.f16.f16"
#else
#define WGMMA_TYPES "f32.bf16.bf16"
#endif

/* y (rows x cols, 16-bit; cols a multiple of 8) <- x rounded, where element (i, kk) of x
   lies at x[x_off + i s_row + kk s_col]: op(a) is (s_row, s_col) = (lda, 1), or (1, lda)
   transposed. A block of 32 x 8 threads copies 32 rows of 64 columns, two columns a thread
   written as one 32-bit word; a tile read across x's rows (s_row 1) goes through shared
   memory, so that reads and writes are both coalesced. Built with SOURCE_HALF, x is in
   16-bit storage already (portanet/precision.py) and its bits are copied as they are. */
#if SOURCE_HALF
#define SOURCE unsigned short
#define SOURCE_BITS(v) (v)
#else
#define SOURCE real
#define SOURCE_BITS(v) half_bits(v)
#endif
KERNEL void kmajor16(GLOBAL unsigned short* y, const int y_off, const GLOBAL SOURCE* x,
                     const int x_off, const int rows, const int cols, const int s_row,
                     const int s_col) {
    __shared__ unsigned short tile[64][33];
    const int k0 = blockIdx.x * 64, i0 = blockIdx.y * 32;
    const int tx = threadIdx.x, ty = threadIdx.y, kk = k0 + 2 * tx;
    GLOBAL unsigned int* words = (GLOBAL unsigned int*)(y + y_off);
    if (s_col == 1) {
        for (int r = ty; r < 32; r += 8) {
            const int i = i0 + r;
            if (i < rows && kk < cols) {
                const GLOBAL SOURCE* from = x + x_off + (size_t)i * s_row + kk;
                words[((size_t)i * cols + kk) / 2] =
                    SOURCE_BITS(from[0]) | ((unsigned int)SOURCE_BITS(from[1]) << 16);
            }
        }
        return;
    }
    for (int r = ty; r < 64; r += 8) {
        const int i = i0 + tx;
        if (i < rows && k0 + r < cols)
            tile[r][tx] = SOURCE_BITS(x[x_off + i + (size_t)(k0 + r) * s_col]);
    }
    __syncthreads();
    for (int r = ty; r < 32; r += 8) {
        const int i = i0 + r;
        if (i < rows && kk < cols)
            words[((size_t)i * cols + kk) / 2] =
                tile[2 * tx][r] | ((unsigned int)tile[2 * tx + 1][r] << 16);
    }
}

/* a TMA descriptor (cuTensorMapEncodeTiled's CUtensorMap), in device memory: passed by
   value, its 64-byte alignment moves it within the parameters, where a launch from one
   packed buffer (pycuda's) does not put it */
struct __align__(64) TensorMap { unsigned long long words[16]; };

DEVICE unsigned shared_address(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

DEVICE void barrier_init(const unsigned bar, const unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(bar), "r"(count));
}

DEVICE void barrier_wait(const unsigned bar, const unsigned phase) {
    unsigned done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(phase) : "memory");
}

DEVICE void barrier_arrive(const unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(bar) : "memory");
}

/* the producer's arrival on a `full` barrier, which then also waits for `bytes` of copies */
DEVICE void barrier_expect(const unsigned bar, const unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 :: "r"(bar), "r"(bytes) : "memory");
}

/* the box of `map` at (x along the rows, y down them) into shared memory at dst */
DEVICE void tma_load(const unsigned dst, const TensorMap* map, const unsigned bar,
                     const int x, const int y) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx"
                 "::bytes [%0], [%1, {%3, %4}], [%2];\n"
                 :: "r"(dst), "l"((unsigned long long)map), "r"(bar), "r"(x), "r"(y)
                 : "memory");
}

/* what wgmma reads of a K-major tile in the 128-byte swizzle: its address, 8 rows of 128
   bytes (1024) from one group of rows to the next, the swizzle (1 in bits 62-63) */
DEVICE unsigned long long tile_descriptor(const unsigned address) {
    return (unsigned long long)((address & 0x3FFFF) >> 4) | (1ull << 16)
           | ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

/* the sums' registers as the asm sees them: nothing moves them across a wgmma */
DEVICE void hold(float (&d)[128]) {
#pragma unroll
    for (int i = 0; i < 128; i++) asm volatile("" : "+f"(d[i]) :: "memory");
}

#define D4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define D16(i) D4(i), D4(i + 4), D4(i + 8), D4(i + 12)

/* d (64 x 256 over the warpgroup) += a (64 x 16) b (16 x 256), both read from shared memory */
DEVICE void wgmma_step(float (&d)[128], const unsigned long long a,
                       const unsigned long long b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n256k16." WGMMA_TYPES " {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, "
        "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, "
        "%34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, "
        "%50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, "
        "%66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "
        "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, "
        "%98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, "
        "%126, %127}, %128, %129, 1, 1, 1, 0, 0;\n"
        : D16(0), D16(16), D16(32), D16(48), D16(64), D16(80), D16(96), D16(112)
        : "l"(a), "l"(b));
}

KERNEL void __launch_bounds__(THREADS, 1)
gemm_wgmma(const GLOBAL TensorMap* a_map, const GLOBAL TensorMap* b_map, GLOBAL real* c,
           const int c_off, const int ldc, const int m, const int n, const int k,
           const real alpha, const real beta) {
    extern __shared__ unsigned char shared_bytes[];
    /* the swizzle repeats every 1024 bytes: the stages start on such a boundary */
    const unsigned base = (shared_address(shared_bytes) + 1023) & ~1023u;
    const unsigned a_tiles = base, b_tiles = base + STAGES * A_STAGE;
    const unsigned full = b_tiles + STAGES * B_STAGE, empty = full + 8 * STAGES;
    /* blocks in groups of GROUP_M tiles down m, each group across n, so that the blocks
       running at once read few tiles of a and b (and from L2, not device memory) */
    const int tiles_m = (m + BM - 1) / BM, tiles_n = (n + BN - 1) / BN;
    const int width = GROUP_M * tiles_n, first = blockIdx.x / width * GROUP_M;
    const int height = min(tiles_m - first, GROUP_M), place = blockIdx.x % width;
    const int m0 = (first + place % height) * BM, n0 = place / height * BN;
    const int group = threadIdx.x / 128;
    const int steps = (k + BK - 1) / BK;
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) {
            barrier_init(full + 8 * s, 1);
            barrier_init(empty + 8 * s, 2);         /* one arrival per consumer */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (group == 0) {                               /* the producer */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) {
            for (int t = 0; t < steps; t++) {
                const int s = t % STAGES;
                if (t >= STAGES) barrier_wait(empty + 8 * s, (t / STAGES - 1) & 1);
                barrier_expect(full + 8 * s, A_STAGE + B_STAGE);
                tma_load(a_tiles + s * A_STAGE, a_map, full + 8 * s, t * BK, m0);
                tma_load(b_tiles + s * B_STAGE, b_map, full + 8 * s, t * BK, n0);
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; i++) d[i] = 0.0f;
    const unsigned rows = (group - 1) * 64 * BK * 2;        /* this consumer's 64 rows of a */
    for (int t = 0; t < steps; t++) {
        const int s = t % STAGES;
        barrier_wait(full + 8 * s, (t / STAGES) & 1);
        hold(d);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)                /* 16 inputs: 32 bytes along K */
            wgmma_step(d, tile_descriptor(a_tiles + s * A_STAGE + rows + 32 * kk),
                       tile_descriptor(b_tiles + s * B_STAGE + 32 * kk));
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        /* the step before is done (this one may still run): its stage is free */
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        hold(d);
        if (t > 0 && threadIdx.x % 128 == 0) barrier_arrive(empty + 8 * ((t - 1) % STAGES));
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    hold(d);

    /* thread l of warp w holds, for each 8 columns j, rows r and r + 8 (r = 16 w + l / 4),
       columns 8 j + 2 (l % 4) and the next */
    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;
    const int r = m0 + (group - 1) * 64 + 16 * warp + lane / 4;
#pragma unroll
    for (int j = 0; j < 32; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = r + 8 * (e / 2), col = n0 + 8 * j + 2 * (lane % 4) + e % 2;
            if (i < m && col < n) {
                GLOBAL real* out = c + c_off + (size_t)i * ldc + col;
                *out = beta == 0 ? alpha * d[4 * j + e] : alpha * d[4 * j + e] + beta * *out;
            }
        }
    }
}
