source bench/gpu_setup.sh
export PYTHONPATH=$PWD:$PYTHONPATH
python3 build/s11/probe.py 2>&1 | tee $OUT/probe.txt
