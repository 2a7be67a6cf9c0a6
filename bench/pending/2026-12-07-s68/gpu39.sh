#!/usr/bin/env bash
# Session 68, for the next session (~550 s, one call on an H100: close to the 600 s limit; drop early-frame-go to make room): session 68's resident defaults
# timed together. g35 timed the frame block's go (RESIDENT_FRAMER_GO), g37 the last-joining leader
# (RESIDENT_LEADER_LAST, before its level condition, which session 68 added afterwards for xlstm)
# and mamba's SSM root a warp per channel (WARP_SPLIT_MIN 16) each against the default of its run;
# the three together are the default now and were never timed as one.
# 1. resident_variants, 11 zoo archs: default against leader-first and warp-roots-32, 2 rounds
#    (warp-roots-32 changes only mamba's and jamba's sources; its other rows repeat the default),
#    and early-frame-go: the frame's x words published at entry (EARLY_FRAME_WORDS), which could not
#    help a resident frame while the other blocks took the go late (session 66's resident timing)
# 2. the resident traces of mamba and xlstm with the defaults
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g39
echo "== resident, 11 archs $(date +%T)"
timeout 450 python3 bench/microbench/resident_variants.py \
  --archs min_gru,min_lstm,gru,lstm,gated_ssm,attention,liquid,jamba,delta_net,mamba,xlstm --rounds 2 \
  --variants default,leader-first,warp-roots-32,early-frame-go --out $OUT/g39/resident.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g39/resident.log
echo "== resident traces $(date +%T)"
timeout 90 python3 bench/stepkernel.py --archs , --trace-resident mamba,xlstm --select stepkernel-fewer-phases \
  --out $OUT/g39/traces 2>&1 | grep -e "trace-resident" -e Error | tee $OUT/g39/traces.log
echo "done $(date +%T)"
