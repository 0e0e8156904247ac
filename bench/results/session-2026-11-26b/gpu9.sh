# session 26b, call 9: the routes tests again after the scope left out PoCL's memory sizes
# (call 8: PoCL's second process on this host had found no routes for itself)
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH
for i in 1 2; do
  timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_routes.py 2>&1 | tail -6 \
    >> $OUT/tests-routes-9.txt
done
cat $OUT/tests-routes-9.txt
