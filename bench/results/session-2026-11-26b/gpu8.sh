# session 26b, call 8: PORTANET_ROUTES on the GPU: its tests on cuda and NVIDIA's OpenCL, then
# the same seed trained in separate processes, three without a routes file and three with
# one (the first of them writes it): Fashion-MNIST LeNet, 4 epochs, on NVIDIA's OpenCL
# (where processes had moved by up to 0.5 pp) and in tf32 on cuda
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_routes.py > $OUT/tests-routes-8.txt 2>&1
tail -6 $OUT/tests-routes-8.txt
for dev in "opencl:0:0 fp32" "cuda tf32"; do
  set -- $dev
  for routes in none none none file file file; do
    if [ $routes = file ]; then export PORTANET_ROUTES=/tmp/routes-$1.json; else unset PORTANET_ROUTES; fi
    timeout 100 python3 -m portanet.cli train --model lenet --device $1 --precision $2 --epochs 4 \
      --seed 0 --json 2>/dev/null | tail -1 | python3 -c "import json,sys; r=json.loads(sys.stdin.read()); \
print('$1', '$2', '$routes', r['test_accuracy'], round(sum(r['epoch_seconds']), 2))" >> $OUT/routes-accuracy-8.txt
  done
done
cat $OUT/routes-accuracy-8.txt
