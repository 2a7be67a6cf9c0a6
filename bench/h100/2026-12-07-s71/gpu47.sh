#!/usr/bin/env bash
# Session 70 (~300 s, one call on an H100). gpu45.sh's test_resident run passed 52 cases, failed the
# 53rd (xlstm's paced tactic on 16 SMs) and was cut at 410 s before the 54th. Reproduced on the CPU:
# with every copy at frame start the paced commit points were the resident kernel's own, so its
# range table differed from the launched kernel's and CompiledStep.resident_fn refused it; fixed
# (codegen._paced_points and _deferred_points keep PROLOGUE_GROUPS). Here: the fewer-SMs cases, the
# 54th and the new block_sms case verbose, the sanitizers on five archs' resident kernels (with
# RESIDENT_COPIES_AT_START_GROUPS 10, not sanitized yet), then gpu46.sh's backoff on xlstm alone.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g47
timeout 150 python3 -m pytest -m gpu -v -p no:cacheprovider tests/gpu/test_resident.py \
  -k "on_fewer_sms or created_and_dropped or report_the_sm" 2>&1 | tail -40 | tee $OUT/g47/tests.log | tail -8
k="resident_matches_onnxruntime_over_chained_frames and (min_gru or gru or mamba or attention or xlstm)"
bash tests/gpu/sanitize.sh memcheck $OUT/g47/sanitize -t 110 -k "$k" tests/gpu/test_resident.py &
bash tests/gpu/sanitize.sh racecheck $OUT/g47/sanitize -t 110 -k "$k" tests/gpu/test_resident.py &
wait
timeout 110 python3 bench/microbench/resident_variants.py --archs xlstm --rounds 2 --sessions 2 \
  --variants default,backoff-64,backoff-256 --out $OUT/g47/backoff.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g47/backoff.log
echo "done $(date +%T)"
