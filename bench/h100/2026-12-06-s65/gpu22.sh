#!/usr/bin/env bash
# Session 65 (~250 s): schedule.SPLIT_SUMS_KEPT now on (it changes the split tactics' kernels
# only): the split GPU tests, memcheck and racecheck of split_products_small.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g22
echo "== split GPU tests, sums kept $(date +%T)"
timeout 100 python3 -m pytest -q -m gpu -k split tests/gpu/test_stepkernel.py -p no:cacheprovider 2>&1 | tail -n 4 | tee $OUT/g22/split-tests.log
for tool in memcheck racecheck; do
  timeout 120 bash tests/gpu/sanitize.sh $tool $OUT/g22/san -t 50 -k split_products_small tests/gpu/test_stepkernel.py 2>&1 | tail -2
done
echo "done $(date +%T)"
