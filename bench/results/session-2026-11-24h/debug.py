"""Why gemm_wgmma writes nothing: its parameters as the kernel sees them (printf), and
where its consumers get to."""
import numpy as np
from portanet.backends import sources

real_load = sources.load


def load(family, lang):
    path, text = real_load(family, lang)
    if family == "wgmma":
        text = "#include <cstdio>\n" + text
        text = text.replace(
            "    const int steps = (k + BK - 1) / BK;\n",
            "    const int steps = (k + BK - 1) / BK;\n"
            "    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x % 128 == 0)\n"
            "        printf(\"thread %d: c_off %d ldc %d m %d n %d k %d alpha %f beta %f "
            "map %llx %llx base %u\\n\", threadIdx.x, c_off, ldc, m, n, k, alpha, beta, "
            "a_map.words[0], b_map.words[1], base);\n"
            "    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {\n"
            "        const char* p0 = (const char*)&a_map;\n"
            "        printf(\"offsets b_map %d c %d c_off %d beta %d\\n\", (int)((const char*)&b_map - p0), (int)((const char*)&c - p0), (int)((const char*)&c_off - p0), (int)((const char*)&beta - p0));\n"
            "        for (int w = 0; w < 40; w++) printf(\"w%d %llx\\n\", w, ((const unsigned long long*)p0)[w]);\n"
            "    }\n")
        text = text.replace(
            "    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;\n",
            "    const int warp = (threadIdx.x % 128) / 32, lane = threadIdx.x % 32;\n"
            "    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x % 128 == 0)\n"
            "        printf(\"thread %d at the epilogue: d[0] %f d[1] %f\\n\", threadIdx.x, d[0], d[1]);\n")
    return path, text


sources.load = load
import portanet as pn                                   # noqa: E402

bk = pn.device("cuda", precision="bf16")
m, n, k = 128, 256, 64
rng = np.random.default_rng(0)
a = rng.standard_normal((m, k)).astype(np.float32)
b = rng.standard_normal((k, n)).astype(np.float32)
A, B, C = bk.upload(a), bk.upload(b), bk.upload(np.full((m, n), np.nan, np.float32))
a16, b16 = bk._kmajor16(A, B, False, False, m, n, k)
h = bk.download(a16)
print("a16 ok:", np.array_equal(h.view(np.uint16) if h.dtype != np.uint16 else h,
                                 (a.view(np.uint32) >> 16).astype(np.uint16)) or "rounded")
kernel = bk._wgmma_kernel()
print("arg format", kernel.arg_format, "attrs regs", kernel.num_regs,
      "shared", kernel.shared_size_bytes)
bk._wgmma(1.0, a16, b16, 0.0, C)
bk.synchronize()
m0 = bk._tensor_map(a16, 128)
print("host map a words", [hex(x) for x in np.frombuffer(m0, np.uint64)[:4]])
import sys
if len(sys.argv) > 1:
    kernel.prepare("128s128sPiiiiiff28x")
    print("padded format", kernel.arg_format)
    bk._wgmma(1.0, a16, b16, 0.0, C)
    bk.synchronize()
got = bk.download(C)
print("NaN", np.isnan(got).sum(), "of", got.size, "c[0,:4]", got[0, :4],
      "ref", (a[0] @ b)[:4])
