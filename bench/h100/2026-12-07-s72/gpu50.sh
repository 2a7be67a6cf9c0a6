#!/usr/bin/env bash
# Session 71 (~380 s, one call on an H100 or H200). codegen.RESIDENT_POLL_AHEAD (runtime.cuh FFK_POLL_AHEAD):
# the frame block's next read of its word in host memory issued beside a relaxed read of the stop
# word, and the other blocks' go polls one L2 round trip each. 1) timed against the default on all
# 11 zoo archs, 2 sessions x 3 rounds each (6 launches a variant: one launch's p50 may sit ~1 us off the others'), bit for bit the launched step (resident_variants.py);
# 2) then, with the setting turned on in this copy of the tree, the sanitizers on five archs'
# resident kernels and test_resident's parity cases (every arch against ONNX Runtime over 64
# frames, bit for bit the launched kernel over 10,000).
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g50
timeout 230 python3 bench/microbench/resident_variants.py \
  --archs min_gru,min_lstm,gru,lstm,gated_ssm,attention,liquid,jamba,delta_net,mamba,xlstm \
  --rounds 3 --sessions 2 --variants default,poll-ahead --out $OUT/g50/resident.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g50/resident.log
sed -i 's/^RESIDENT_POLL_AHEAD = False$/RESIDENT_POLL_AHEAD = True/' framefuse/compiler/codegen.py
grep -n "^RESIDENT_POLL_AHEAD" framefuse/compiler/codegen.py
k="resident_matches_onnxruntime_over_chained_frames and (min_gru or gru or mamba or attention or xlstm)"
bash tests/gpu/sanitize.sh memcheck $OUT/g50/sanitize -t 110 -k "$k" tests/gpu/test_resident.py &
bash tests/gpu/sanitize.sh racecheck $OUT/g50/sanitize -t 110 -k "$k" tests/gpu/test_resident.py &
wait
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_resident.py \
  -k "matches_onnxruntime_over or bit_for_bit_over_10000" \
  2>&1 | tail -5 | tee $OUT/g50/tests.log
echo "done $(date +%T)"
