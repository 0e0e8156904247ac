# session 26c, call 2: the whole suite on cuda and NVIDIA's OpenCL, in 8 workers, at the tree
# with 16-bit storage (its kernels are rebuilt: gemm, elementwise, blas and wgmma changed)
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 565 python3 -m pytest tests -q -p no:cacheprovider -n 8 --durations=10 \
  -k "cuda or nvidia" > $OUT/tests-gpu-2.txt 2>&1
echo "rc $?" >> $OUT/tests-gpu-2.txt
tail -30 $OUT/tests-gpu-2.txt
