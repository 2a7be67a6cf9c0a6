#!/usr/bin/env bash
# session 34, call A: loops carrying h and c (simplify.RollBodies' packed carry) on the GPU: the hand-written LSTM cells,
# the LayerNorm LSTM and MLP cell real models (T = 1, 8, 32), then memcheck + racecheck on them in parallel
set -u
echo "== tests $(date +%T)"
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu -k "body_loops or lnlstm or mlpcell" \
  tests/gpu/test_stepkernel.py tests/real_models/test_real_models_gpu.py 2>&1 | tail -8
S=$OUT/san; mkdir -p $S
run() { # tool name file kexpr
  local extra=(); [ $1 = memcheck ] && extra=(--report-api-errors no)
  timeout ${SANT:-200} compute-sanitizer --tool $1 "${extra[@]}" python3 -m pytest -q -p no:cacheprovider -k "$4" $3 > $S/$1-$2.log 2>&1 &
}
echo "== sanitizers $(date +%T)"
for tool in memcheck racecheck; do
  run $tool hc tests/gpu/test_stepkernel.py "carrying_h_and_c and (T9-b3-h7-gate or T32-b1-h32-norm)"
  run $tool lnlstm tests/real_models/test_real_models_gpu.py "step_kernel_of_real_model and torch_lnlstm_loop and 32"
done
wait
echo "== done $(date +%T)"
for f in $S/*.log; do printf '%-22s %s | %s\n' $(basename $f .log) "$(grep -E '(passed|failed|error)' $f | grep -E ' in [0-9.]+s' | tail -n 1)" "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $f | tail -n 1)"; done | tee $OUT/san-summary.txt
tar czf $OUT/san-logs.tgz -C $OUT san && rm -rf $S
