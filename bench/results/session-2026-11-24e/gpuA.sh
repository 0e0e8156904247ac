# this session's change on the H100: its tests on cuda and NVIDIA's OpenCL, the precision
# tests of the 16-bit copies (half_operands), and a profile of the fp16 step
source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 240 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_loss_scaling.py \
    tests/test_kernels.py -k "(cuda or nvidia) and (loss or scal or skip or update or torch)" \
    2>&1 | tail -15 | tee $OUT/tests-loss-scaling.txt
timeout 260 python3 -m pytest -q -p no:cacheprovider -rfE tests/test_precision.py \
    -k "cuda and (gemm or bits or ties or dense or training)" 2>&1 | tail -12 \
    | tee $OUT/tests-precision.txt
timeout 60 python3 -m portanet.cli profile mlp-big --batch-size 10000 --precision fp16 \
    --device cuda 2>&1 | tail -40 > $OUT/profile-mlp-big-fp16.txt
