#!/usr/bin/env bash
# Session 70, after codegen.RESIDENT_COPIES_AT_START_GROUPS 10 became the default (one part a call):
#   PART=tests     where the resident p50 spread comes from (resident_spread.py: gated_ssm, min_gru,
#                  mamba, 4 sessions x 3 launches each), then tests/gpu/test_resident.py whole
#   PART=sanitize  compute-sanitizer memcheck and racecheck side by side on the resident kernel of
#                  five archs (embed 64, 64 frames), each cut at 250 s
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
part=${PART:?PART=tests|sanitize}
mkdir -p $OUT/g45-$part
case $part in
tests)
  timeout 170 python3 bench/microbench/resident_spread.py --archs gated_ssm,min_gru,mamba --sessions 4 --launches 3 \
    --out $OUT/g45-$part/spread.json 2>&1 | grep -v -e Warn -e "session = Session" | tee $OUT/g45-$part/spread.log
  timeout 410 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_resident.py 2>&1 \
    | tee $OUT/g45-$part/tests.log | tail -15 ;;
sanitize)
  k="resident_matches_onnxruntime_over_chained_frames and (min_gru or gru or mamba or attention or xlstm)"
  bash tests/gpu/sanitize.sh memcheck $OUT/g45-$part -t 250 -k "$k" tests/gpu/test_resident.py &
  bash tests/gpu/sanitize.sh racecheck $OUT/g45-$part -t 250 -k "$k" tests/gpu/test_resident.py &
  wait ;;
esac
echo "done $(date +%T)"
