#!/usr/bin/env bash
# Session 64, issue 18 (~270 s): the head on the host (compiler/tail.py), then tagged outputs.
# 1. tail_roundtrip.cu: the transport alone, the head as a level of its own (4 or 1 head blocks)
#    vs 124 blocks writing y's words to host memory and the host computing the head.
# 2. host_tail.py: resident Session-style frames (hostpath.c's frame call) of the whole program's
#    kernel vs the kernel less its last level + the tail's C++ function, both with tagged outputs,
#    p50 / p99, outputs compared over 200 frames.
# 3. resident_variants.py on min_gru and mamba: tagged outputs in host-write chunks of 8 / 16
#    (mamba's p99 in session 62), the default kernel on 66 SMs.
# QUICK=1: parts 1 and 2 only, host_tail.py on min_gru, gru, mamba (~130 s, for little device time).
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g19
echo "== tail_roundtrip $(date +%T)"
nvcc -O3 -arch=sm_90 -Xcompiler -march=native -o /tmp/tail_roundtrip bench/microbench/tail_roundtrip.cu \
  && timeout 60 /tmp/tail_roundtrip 2>&1 | tee $OUT/g19/tail_roundtrip.log
echo "== host_tail.py $(date +%T)"
TAIL_ARCHS=min_gru,gru,gated_ssm,mamba
[ "${QUICK:-0}" = 1 ] && TAIL_ARCHS=min_gru,gru,mamba
timeout 120 python3 bench/microbench/host_tail.py --archs $TAIL_ARCHS --out $OUT/g19/host_tail.json 2>&1 \
  | grep -v Warn | tee $OUT/g19/host_tail.log
[ "${QUICK:-0}" = 1 ] && { echo "done $(date +%T)"; exit 0; }
echo "== resident variants $(date +%T)"
timeout 110 python3 bench/microbench/resident_variants.py --archs min_gru,mamba --rounds 3 \
  --variants default,tagged-outputs,tagged-outputs-16 --sms 66 --out $OUT/g19/resident.json 2>&1 \
  | grep -v Warn | tee $OUT/g19/resident.log
echo "done $(date +%T)"
