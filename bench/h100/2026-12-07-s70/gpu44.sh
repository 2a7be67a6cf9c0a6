#!/usr/bin/env bash
# Session 70 (~260 s, one call on an H100): the resident kernel with codegen.RESIDENT_COPIES_AT_START_GROUPS
# 10 (the new default: every copy issued at frame start in kernels of 10 or more commit groups)
# against copies between tasks everywhere (the old default), at start everywhere, and
# codegen.RESIDENT_DISPATCH (each of a block's tasks reached with one jump from a switch), on all
# 11 zoo archs, 2 rounds, in one process.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g44
timeout 540 python3 bench/microbench/resident_variants.py \
  --archs min_gru,min_lstm,gru,lstm,gated_ssm,attention,liquid,jamba,delta_net,mamba,xlstm --rounds 2 \
  --variants default,copies-between,copies-at-start,dispatch --out $OUT/g44/resident.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g44/resident.log
echo "done $(date +%T)"
