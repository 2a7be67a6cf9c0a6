#!/usr/bin/env bash
# Session 69 (~90 s, one call on an H100): codegen.RESIDENT_COPIES_AT_START, every commit group's
# copies issued while the frame is awaited (g41's mamba trace: a block entered its next task
# ~0.25 us later for every commit point it passed), against the default, 2 rounds, with the
# outputs bit for bit the launched kernel's over 200 frames
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g42
timeout 200 python3 bench/microbench/resident_variants.py --archs ${ARCHS:-mamba,xlstm,attention,min_gru} --rounds 2 \
  --variants default,copies-at-start --out $OUT/g42/resident${TAG:-}.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g42/resident${TAG:-}.log
echo "done $(date +%T)"
