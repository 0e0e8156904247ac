#!/usr/bin/env bash
# First use of a device with empty kernel caches, then a second run over what the first
# cached: `portanet train --model lenet --epochs 1 --limit 2000` twice, its seconds each.
#   bash bench/first_use.sh --device cuda [--precision bf16]
# (on a GPU host without a package index, source bench/gpu_setup.sh first)
set -o pipefail
cache=$(mktemp -d)
export XDG_CACHE_HOME=$cache PYCUDA_CACHE_DIR=$cache/pycuda CUDA_CACHE_PATH=$cache/nv \
    POCL_CACHE_DIR=$cache/pocl
for run in first second; do
    start=$(date +%s.%N)
    python3 -m portanet.cli train --model lenet --epochs 1 --limit 2000 "$@" > /dev/null || exit
    echo "$* $run run: $(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $start}") s"
done
rm -rf "$cache"
