#!/usr/bin/env bash
# The closing run on the GPU machine: the whole suite (cpu, NVIDIA OpenCL, CUDA), what
# NVIDIA's OpenCL offers for command buffers, and `portanet bench` with both PyTorch peers.
# Needs .gpu, .whl and .data carried; results in $OUT.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source .gpu/gpu-env.sh > /dev/null || exit 1
python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH PORTANET_DATA=$PWD/.data PYTHONUNBUFFERED=1
timeout 250 python3 -m pytest -q -p no:cacheprovider tests > "$OUT/h100-pytest.log" 2>&1
tail -1 "$OUT/h100-pytest.log"; grep -E "^(FAILED|ERROR)" "$OUT/h100-pytest.log"
python3 - <<'PY' | tee "$OUT/opencl-extensions.txt"
import pyopencl as cl
for p in cl.get_platforms():
    for d in p.get_devices():
        ext = d.extensions.split()
        print(f"{p.name} / {d.name} ({d.driver_version}): "
              f"{[e for e in ext if 'command_buffer' in e or 'mutable' in e] or 'no command-buffer extension'}")
PY
timeout 300 python3 -m portanet.cli bench --device cuda --device opencl:0:0 \
    --workload mlp-small --workload lenet-step --workload mlp-big --workload lenet-infer \
    --json "$OUT/bench-h100-final.json" 2>/dev/null | tee "$OUT/bench-h100-final.txt" | tail -14
