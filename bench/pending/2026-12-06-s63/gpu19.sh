#!/usr/bin/env bash
# Session 64: tagged outputs (codegen.TAGGED_OUTPUTS) were 0.4-0.9 us faster at resident p50 on
# every arch timed in session 62, but mamba's resident p99 was 1-2 us worse: its head writes its
# 32 output words (8 bytes each) from 4 blocks of 8, two blocks' words in one 128-byte host line.
# resident_variants.py: plain, tagged (chunks of 8), tagged in chunks of 16 (a block's words one
# whole line) and of 32 (the head on one block); bit for bit against the launched kernel over 200
# frames, 3 interleaved rounds, p50 / p99; and the default on 66 and 33 SMs (resident_sms: level_cost.cu
# measured a level on 32 blocks 0.2 us cheaper than on 128; last timed on 2026-11-24 kernels).
# First, tail_roundtrip.cu: the head as a level of its own vs y written to host memory as tagged
# words and the head computed by the host (a level fewer on the GPU).
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g19
echo "== tail_roundtrip $(date +%T)"
nvcc -O3 -arch=sm_90 -Xcompiler -march=native -o /tmp/tail_roundtrip bench/microbench/tail_roundtrip.cu \
  && timeout 60 /tmp/tail_roundtrip 2>&1 | tee $OUT/g19/tail_roundtrip.log
echo "== resident variants $(date +%T)"
timeout 300 python3 bench/microbench/resident_variants.py --archs min_gru,mamba,gated_ssm,min_lstm --rounds 3 \
  --variants default,tagged-outputs,tagged-outputs-16,tagged-outputs-32 --sms 66,33 --out $OUT/g19/resident.json 2>&1 \
  | grep -v Warn | tee $OUT/g19/resident.log
echo "done $(date +%T)"
