#!/usr/bin/env bash
# Session 72 (~400 s, one call on an H100). codegen.RESIDENT_FRAMER_REPLICAS: each frame block
# replicated on a free block that polls a second copy of the frame words RESIDENT_REPLICA_DELAY
# cycles behind it. 1) the GPU tests (bit for bit the launched kernel, native and Python frame
# paths, a restart after an odd number of frames); 2) memcheck and racecheck on the small case;
# 3) timed against the default on the 6 zoo archs whose grid leaves free blocks (2 sessions x 3
# rounds, bit for bit), at delays 1100 (default), 600 and 1600 cycles.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g53
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_resident.py -k framer_replicas \
  2>&1 | tail -5 | tee $OUT/g53/tests.log
k="framer_replicas and small"
bash tests/gpu/sanitize.sh memcheck $OUT/g53/sanitize -t 120 -k "$k" tests/gpu/test_resident.py &
bash tests/gpu/sanitize.sh racecheck $OUT/g53/sanitize -t 120 -k "$k" tests/gpu/test_resident.py &
wait
timeout 260 python3 bench/microbench/resident_variants.py \
  --archs min_gru,min_lstm,gru,lstm,liquid,mamba \
  --rounds 3 --sessions 2 --variants default,replicas,replicas-600,replicas-1600 --out $OUT/g53/resident.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g53/resident.log
echo "done $(date +%T)"
