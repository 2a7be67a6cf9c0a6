#!/usr/bin/env bash
# session 34, call B: computed windows no loop feeds staged whole with batched flag-tagged loads (schedule.body_plan,
# codegen._flagged_runs): body-loop GPU tests, memcheck + racecheck, the LayerNorm LSTM's trace, the selections' timings
set -u
echo "== tests $(date +%T)"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 -k "body_loops or lnlstm or mlpcell" \
  tests/gpu/test_stepkernel.py tests/real_models/test_real_models_gpu.py 2>&1 | tail -4
S=$OUT/san; mkdir -p $S
run() { # tool name file kexpr
  local extra=(); [ $1 = memcheck ] && extra=(--report-api-errors no)
  timeout ${SANT:-150} compute-sanitizer --tool $1 "${extra[@]}" python3 -m pytest -q -p no:cacheprovider -k "$4" $3 > $S/$1-$2.log 2>&1 &
}
echo "== sanitizers $(date +%T)"
for tool in memcheck racecheck; do
  run $tool hand tests/gpu/test_stepkernel.py "body_loops_match and 7-3-5-33"
  run $tool lnlstm tests/real_models/test_real_models_gpu.py "step_kernel_of_real_model and torch_lnlstm_loop and 32"
done
wait
for f in $S/*.log; do printf '%-22s %s | %s\n' $(basename $f .log) "$(grep -E '(passed|failed|error)' $f | grep -E ' in [0-9.]+s' | tail -n 1)" "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $f | tail -n 1)"; done | tee $OUT/san-summary-b.txt
tar czf $OUT/san-logs-b.tgz -C $OUT san && rm -rf $S
echo "== trace $(date +%T)"
timeout 60 python3 bench/h200/2026-11-28-s34/trace_lnlstm.py 2>&1 | grep -v "^\[transformers\]" > $OUT/trace_lnlstm_whole.txt; tail -8 $OUT/trace_lnlstm_whole.txt
echo "== selection $(date +%T)"
timeout 150 python3 bench/h200/2026-11-28-s34/sel_body.py torch_lnlstm_loop 32 torch_mlpcell_loop 32 2>&1 | grep -v "^\[transformers\]" | tee $OUT/sel_body.txt
echo "== done $(date +%T)"
