#!/usr/bin/env bash
# Issue 17 on the GPU machine (device tool), where PyTorch is. Carry .gpu
# (../shared/device), .whl (the safetensors wheel; .whl/onnx: the cp312 wheels of onnx,
# onnxscript, onnx_ir, ml_dtypes, protobuf, packaging and typing_extensions, from
# `pip download --only-binary=:all: --python-version 3.12 onnx onnxscript`) and .data
# (Fashion-MNIST). ONNX Runtime does not travel (the carry limit): the comparisons with it
# run in CI; here PyTorch is the oracle.
#   bash bench/gpu_issue17.sh interop   the interop tests (test_torch_interop, test_dlpack,
#                                       test_onnx, test_torch_state, test_readme) on all
#                                       devices but PoCL: cpu,
#                                       cuda and opencl:nvidia
#   bash bench/gpu_issue17.sh suite     every test on cuda and opencl:nvidia
# Results under $OUT.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
source .gpu/gpu-env.sh > /dev/null || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/safetensors*.whl \
    .whl/onnx/*.whl || exit 1
export PYTHONUNBUFFERED=1 PORTANET_DATA=$PWD/.data PYTHONPATH=$PWD:$PYTHONPATH
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, onnx; print('torch', torch.__version__, 'onnx', onnx.__version__)"
case "$1" in
interop)
    timeout 500 python3 -m pytest -q -rs tests/test_torch_interop.py tests/test_dlpack.py \
        tests/test_onnx.py tests/test_torch_state.py tests/test_readme.py \
        -k "not pocl" -p no:cacheprovider 2>&1 | tail -40 \
        | tee "$OUT/interop-tests.log" ;;
suite)
    timeout 560 python3 -m pytest -q -x tests -k "cuda or nvidia" -p no:cacheprovider 2>&1 \
        | tail -12 | tee "$OUT/suite-tests.log" ;;
esac
