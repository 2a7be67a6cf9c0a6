#!/usr/bin/env bash
# Session 69: the GPU tests of the final kernel state (session 68's framer go, leader-last with its
# level condition, WARP_SPLIT_MIN 16; session 69's MergeCommon Concat key, which changes mamba's
# sources), one part a call (each under 600 s):
#   PART=resident   tests/gpu/test_resident.py whole (54 cases)
#   PART=stepkernel every zoo arch launched against ONNX Runtime over 200 chained steps, and mamba's
#                   tactics, sequence windows, odd sizes, batch 3, NaN / Inf frames
#   PART=sanitize   compute-sanitizer memcheck and racecheck side by side on the resident kernel of
#                   five archs (embed 64, 64 frames), each cut at 250 s
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
part=${PART:?PART=resident|stepkernel|sanitize}
mkdir -p $OUT/g40-$part
case $part in
resident)
  timeout 560 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_resident.py 2>&1 \
    | tee $OUT/g40-$part/tests.log | tail -15 ;;
stepkernel)
  timeout 290 python3 -m pytest -m gpu -v -p no:cacheprovider tests/gpu/test_stepkernel.py -k \
    "chained_steps or (mamba and (tactics_match or sequence_window or odd_sizes or batch_of_three or nan_and_inf or transposed_window))" \
    2>&1 | tee $OUT/g40-$part/tests.log | tail -15 ;;
sanitize)
  k="resident_matches_onnxruntime_over_chained_frames and (min_gru or gru or mamba or attention or xlstm)"
  bash tests/gpu/sanitize.sh memcheck $OUT/g40-$part -t 250 -k "$k" tests/gpu/test_resident.py &
  bash tests/gpu/sanitize.sh racecheck $OUT/g40-$part -t 250 -k "$k" tests/gpu/test_resident.py &
  wait ;;
esac
echo "done $(date +%T)"
