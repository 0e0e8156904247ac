source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
for p in bf16 tf32; do
timeout 120 python3 -m portanet.cli profile mlp-big --device cuda --batch-size 10000 \
    --precision $p 2>&1 | grep -v "^ *$" | head -45 | tee $OUT/profile-mlp-big-$p.txt
done
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_precision.py -k \
    "cuda and (16_bit or ties)" 2>&1 | tail -4 | tee $OUT/tests-inline.txt
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_kernels.py tests/test_training.py \
    -k "cuda and (gemm or bias or dense or axpy or momentum or fit)" 2>&1 | tail -4 | \
    tee $OUT/tests-fp32.txt
