#!/usr/bin/env bash
# Session 70 (~200 s, one GPU call; any H100 or H200): gpu47.sh without its timing part: the
# fewer-SMs cases of test_resident and the 54th case verbose, then compute-sanitizer memcheck and
# racecheck on five archs' resident kernels with RESIDENT_COPIES_AT_START_GROUPS 10 (each cut at 90 s).
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g48
timeout 130 python3 -m pytest -m gpu -v -p no:cacheprovider tests/gpu/test_resident.py \
  -k "on_fewer_sms or created_and_dropped" 2>&1 | tail -40 | tee $OUT/g48/tests.log | tail -8
k="resident_matches_onnxruntime_over_chained_frames and (min_gru or gru or mamba or attention or xlstm)"
bash tests/gpu/sanitize.sh memcheck $OUT/g48/sanitize -t 90 -k "$k" tests/gpu/test_resident.py &
bash tests/gpu/sanitize.sh racecheck $OUT/g48/sanitize -t 90 -k "$k" tests/gpu/test_resident.py &
wait
echo "done $(date +%T)"
