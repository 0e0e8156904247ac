#!/usr/bin/env bash
# Issues 17 and 16 on the GPU machine (device tool), where PyTorch is. Carry .gpu
# (../shared/device), .whl (the safetensors wheel; .whl/onnx: cp312 wheels of onnx,
# onnxscript, onnx_ir, ml_dtypes, protobuf, packaging, typing_extensions; .whl/mpi: mpi4py
# and mpich, `pip download --only-binary=:all: --python-version 3.12 ...`) and .data
# (Fashion-MNIST). The image has onnx, onnxscript, onnxruntime and mpi4py already
# (KINDS.md); the carried wheels go in only where an import fails. Modes:
#   interop   the interop tests (test_torch_interop, test_dlpack, test_onnx,
#             test_torch_state, test_readme) on every device but PoCL: cpu, cuda and
#             opencl:nvidia
#   suite     every test on cuda and opencl:nvidia
#   mixed     issue 16: a job of one cuda rank and one opencl:0:0 rank trains the
#             Fashion-MNIST MLP 5 epochs (MPI, global batch 2 x 64), beside one process
#             on cuda over the same global batches; then with --balance
# Results under $OUT.
source bench/gpu_setup.sh
python3 -c "import onnx, onnxscript" 2>/dev/null || python3 -m pip install -q --no-index \
    --no-deps --target /tmp/site .whl/onnx/*.whl || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH
python3 -c "import torch, onnx, onnxruntime as ort
print('torch', torch.__version__, 'onnx', onnx.__version__, 'onnxruntime', ort.__version__)"
case "$1" in
interop)
    timeout 500 python3 -m pytest -q -rs tests/test_torch_interop.py tests/test_dlpack.py \
        tests/test_onnx.py tests/test_torch_state.py tests/test_readme.py \
        -k "not pocl" -p no:cacheprovider --tb=short -rf 2>&1 | tail -150 \
        | tee "$OUT/interop-tests.log" ;;
suite)
    timeout 560 python3 -m pytest -q -x tests -k "cuda or nvidia" -p no:cacheprovider 2>&1 \
        | tail -12 | tee "$OUT/suite-tests.log" ;;
mixed)
    command -v mpiexec > /dev/null || { python3 -m pip install -q --no-index --no-deps \
        --target /tmp/site .whl/mpi/*.whl && export PATH=/tmp/site/bin:$PATH; } || exit 1
    # the image's mpiexec is Open MPI's, which refuses root (the machine runs us as root)
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    run() { timeout 280 "$@" --model mlp --epochs 5 --json 2>&1 | grep -v Warning; }
    PORTANET_DEVICE=cuda:0,opencl:0:0 run mpiexec -n 2 python3 -m portanet.cli train \
        --distributed --batch-size 64 | tee "$OUT/mixed.log"
    PORTANET_DEVICE=cuda:0,opencl:0:0 run mpiexec -n 2 python3 -m portanet.cli train \
        --distributed --balance --batch-size 64 | tee "$OUT/mixed-balance.log"
    run python3 -m portanet.cli train --device cuda --batch-size 128 | tee "$OUT/alone.log" ;;
esac
