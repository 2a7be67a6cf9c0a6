#!/usr/bin/env bash
# Session 70 (~250 s, one call on an H100): codegen.STAGE_BACKOFF_NS, a pause before each re-poll of a
# phase staging more than 2 x threads flagged words (xlstm's output projections: 1,029 words in each
# of 128 blocks), 64 and 256 ns, against the default, 2 sessions of each variant (the same kernel's
# p50 differs by ~1 us between sessions), 2 rounds each.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g46
timeout 280 python3 bench/microbench/resident_variants.py --archs xlstm,attention,mamba --rounds 2 --sessions 2 \
  --variants default,backoff-64,backoff-256 --out $OUT/g46/resident.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g46/resident.log
# which launches run ~1.1 us faster (g44, g45): 4 sessions x 6 launches, each with the SM of every block
timeout 150 python3 bench/microbench/resident_spread.py --archs min_gru,gated_ssm --sessions 4 --launches 6 \
  --out $OUT/g46/spread.json 2>&1 | grep -v -e Warn -e "session = Session" | tee $OUT/g46/spread.log
echo "done $(date +%T)"
