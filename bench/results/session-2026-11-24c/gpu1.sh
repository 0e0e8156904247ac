source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
nvcc --version | tail -1
(cd /tmp && nvcc -c -o k.o -arch=sm_90 -DREAL=float -I $OLDPWD/kernels_cu \
    $OLDPWD/kernels_cu/mma.cu -Xptxas -v 2>&1 | grep -i "registers\|spill") | tee $OUT/ptxas.txt
timeout 150 python3 build/s9/mma_bench.py $OUT/mma.txt 2>&1 | tail -40
timeout 200 python3 -m pytest -q -p no:cacheprovider -x tests/test_precision.py -k "cuda or not \
    (gemm or dense or training)" 2>&1 | tail -8 | tee $OUT/tests.txt
for p in fp32 tf32; do
timeout 60 python3 -m portanet.cli train --model mlp --epochs 5 --device cuda --precision $p \
    --json 2>/dev/null | tail -1 >> $OUT/train.jsonl
timeout 60 python3 -m portanet.cli train --model lenet --epochs 5 --device cuda --precision $p \
    --json 2>/dev/null | tail -1 >> $OUT/train.jsonl
done
timeout 150 python3 -m portanet.cli bench --device cuda --workload mlp-big --precision fp32 \
    --precision tf32 --json $OUT/bench.json 2>&1 | tail -12 | tee $OUT/bench.txt
