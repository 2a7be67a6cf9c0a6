#!/usr/bin/env bash
# Session 68 (~280 s, one call on an H100): compute-sanitizer memcheck and racecheck (side by side)
# on the resident kernel with the frame block's go (codegen.RESIDENT_FRAMER_GO) and the tagged twin:
# test_resident.py's small cases (embed 64, 64 chained frames against ONNX Runtime) of five archs.
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g36
K="matches_onnxruntime and (min_gru or gru or mamba or attention or xlstm)"
echo "== sanitizers $(date +%T)"
bash tests/gpu/sanitize.sh memcheck /tmp/g36 -t 250 -k "$K" tests/gpu/test_resident.py > $OUT/g36/memcheck.txt 2>&1 &
bash tests/gpu/sanitize.sh racecheck /tmp/g36 -t 250 -k "$K" tests/gpu/test_resident.py > $OUT/g36/racecheck.txt 2>&1 &
wait
cat $OUT/g36/memcheck.txt $OUT/g36/racecheck.txt
for t in memcheck racecheck; do
  grep -E "PASSED|FAILED|ERROR SUMMARY|RACECHECK SUMMARY|Hazard|Invalid" /tmp/g36/$t-test_resident.log | head -40 > $OUT/g36/$t-lines.log
done
echo "done $(date +%T)"
