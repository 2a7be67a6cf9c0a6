#!/usr/bin/env bash
# Session 64: gpu19s.sh's first two parts only (~130 s), for the little device time left.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g19
echo "== tail_roundtrip $(date +%T)"
nvcc -O3 -arch=sm_90 -Xcompiler -march=native -o /tmp/tail_roundtrip bench/microbench/tail_roundtrip.cu \
  && timeout 40 /tmp/tail_roundtrip 10000 2>&1 | tee $OUT/g19/tail_roundtrip.log
echo "== host_tail.py $(date +%T)"
timeout 100 python3 bench/microbench/host_tail.py --archs min_gru,gru,mamba --rounds 2 --out $OUT/g19/host_tail.json 2>&1 \
  | grep -v Warn | tee $OUT/g19/host_tail.log
echo "done $(date +%T)"
