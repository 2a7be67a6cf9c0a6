#!/usr/bin/env bash
# Session 69, for the next session (~450 s, one call on an H100): codegen.RESIDENT_COPIES_AT_START
# (every commit group's copies issued while the frame is awaited, none between tasks) and
# codegen.ISSUE_CALL (every commit point a call of one function, its code in one place), alone and
# together, against the default on all 11 zoo archs, 2 rounds, in one process (g42 ran
# copies-at-start on 8 archs in two processes: it helped xlstm, attention, jamba, mamba, the kernels
# with 12-15 commit points, and hurt min_gru, delta_net, liquid at p50). If issue-call removes the
# ~0.25 us a commit point costs (g41's trace), copies-at-start may not be needed.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g43
timeout 540 python3 bench/microbench/resident_variants.py \
  --archs min_gru,min_lstm,gru,lstm,gated_ssm,attention,liquid,jamba,delta_net,mamba,xlstm --rounds 2 \
  --variants default,copies-at-start,issue-call,issue-call-at-start --out $OUT/g43/resident.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g43/resident.log
echo "done $(date +%T)"
