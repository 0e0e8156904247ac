# session 26b, call 10: the routes tests after the review (a lock, the first route stays,
# entries with their paths, a scope with compute units and the vendor library)
source bench/gpu_setup.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest_xdist*.whl \
    .whl/execnet*.whl || exit 1
export PYTHONPATH=$PWD:$PYTHONPATH
for i in 1 2; do
  timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_routes.py 2>&1 | tail -12 \
    >> $OUT/tests-routes-10.txt
done
cat $OUT/tests-routes-10.txt
