#!/usr/bin/env bash
# Session 64: gpu19.sh cut to what fits little device time (~150 s): tail_roundtrip.cu, then
# the device time of kernels less their last level (compiler/tail.py's device program: the host
# would compute the head), then resident_variants.py on min_gru and mamba only (tagged outputs in
# chunks of 8 / 16, 66 SMs).
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g19
echo "== tail_roundtrip $(date +%T)"
nvcc -O3 -arch=sm_90 -Xcompiler -march=native -o /tmp/tail_roundtrip bench/microbench/tail_roundtrip.cu \
  && timeout 60 /tmp/tail_roundtrip 2>&1 | tee $OUT/g19/tail_roundtrip.log
echo "== host tail: the kernel less its last level $(date +%T)"
timeout 100 python3 bench/microbench/stepkernel_variants.py --archs min_gru,gru,mamba --base stepkernel-384-threads-fewer-phases \
  --variants baseline,384-threads-fewer-phases+host-tail,384-threads-fewer-phases+tagged-outputs,384-threads-fewer-phases+tagged-outputs+host-tail,baseline \
  --out $OUT/g19/host_tail.json 2>&1 | grep -v Warn | tee $OUT/g19/host_tail.log
echo "== resident variants $(date +%T)"
timeout 120 python3 bench/microbench/resident_variants.py --archs min_gru,mamba --rounds 3 \
  --variants default,tagged-outputs,tagged-outputs-16 --sms 66 --out $OUT/g19/resident.json 2>&1 \
  | grep -v Warn | tee $OUT/g19/resident.log
echo "done $(date +%T)"
