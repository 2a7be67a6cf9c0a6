#!/usr/bin/env bash
# Session 69 (replaces session 68's gpu39.sh, ~350 s, one call on an H100): the resident defaults
# timed together, each against the setting it replaced, in one process per group:
# 1. 11 zoo archs, 2 rounds: default (session 68's framer go, leader-last with its level condition,
#    WARP_SPLIT_MIN 16; session 69's MergeCommon Concat key) against
#    leader-first (the first frame-free block leads)
# 2. mamba, jamba, xlstm, 2 rounds: default against warp-roots-32 (changes mamba's and jamba's
#    sources only) and stage-unroll-8 (changes xlstm's only: its output projections' 1,029 staged
#    words in one L2 round trip, not two)
# 3. the resident traces of mamba and xlstm with the defaults, every block's stamps
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g41
echo "== resident, 11 archs $(date +%T)"
timeout 260 python3 bench/microbench/resident_variants.py \
  --archs min_gru,min_lstm,gru,lstm,gated_ssm,attention,liquid,jamba,delta_net,mamba,xlstm --rounds 2 \
  --variants default,leader-first --out $OUT/g41/resident.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g41/resident.log
echo "== resident, codegen settings $(date +%T)"
timeout 120 python3 bench/microbench/resident_variants.py --archs mamba,jamba,xlstm --rounds 2 \
  --variants default,warp-roots-32,stage-unroll-8 --out $OUT/g41/settings.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g41/settings.log
echo "== resident traces $(date +%T)"
timeout 90 python3 bench/stepkernel.py --archs , --trace-resident mamba,xlstm --select stepkernel-fewer-phases \
  --out $OUT/g41/traces 2>&1 | grep -e "trace-resident" -e Error | tee $OUT/g41/traces.log
echo "done $(date +%T)"
