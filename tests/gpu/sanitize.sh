#!/usr/bin/env bash
# compute-sanitizer over GPU test files, one process per file, in parallel (the GPU has room;
# a sanitizer run is bound by its own per-launch instrumentation, not by the GPU).
#   tests/gpu/sanitize.sh TOOL OUT_DIR [-t SECONDS] [-k EXPR] FILE...
# TOOL is memcheck or racecheck. Each file's log goes to OUT_DIR/<tool>-<file>.log; the last
# lines printed are one summary row per file (pytest's closing line and the sanitizer's summary).
# -t: each file's run stops after that many seconds (racecheck runs ~10 small step-kernel tests in
# 300 s), and its row then says so and counts what it got through: pytest runs verbose, so the
# tests that passed are named in the log, and the sanitizer's reports so far are counted. A run
# cut by a timeout outside this script prints no row at all: give the limit here.
# Long-T cases (T >= 1024) are deselected with -k when asked: under racecheck one such case
# takes minutes, and the short cases already cover every code path (chunk edges included).
set -uo pipefail
tool=$1; out=$2; shift 2
limit=0
if [ "${1:-}" = "-t" ]; then limit=$2; shift 2; fi
# (a limit of 0 or less would run without one: session 66's script passed a negative one)
if ! [ "$limit" -ge 0 ] 2>/dev/null; then echo "sanitize.sh: -t needs a positive number of seconds, got $limit" >&2; exit 2; fi
kexpr=()
if [ "${1:-}" = "-k" ]; then kexpr=(-k "$2"); shift 2; fi
mkdir -p "$out"
extra=()
[ "$tool" = memcheck ] && extra=(--report-api-errors no)  # cuda-bindings probes driver symbols
run=()
[ "$limit" -gt 0 ] && run=(timeout "$limit")
pids=()
for f in "$@"; do
  log="$out/$tool-$(basename "$f" .py).log"
  "${run[@]}" compute-sanitizer --tool "$tool" "${extra[@]}" python3 -m pytest -v -p no:cacheprovider "${kexpr[@]}" "$f" >"$log" 2>&1 &
  pids+=($!)
done
codes=()
for p in "${pids[@]}"; do wait "$p"; codes+=($?); done
i=0
for f in "$@"; do
  log="$out/$tool-$(basename "$f" .py).log"
  closing=$(grep -E '(passed|failed|error)' "$log" | grep -E ' in [0-9.]+s' | tail -n 1)
  summary=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 1)
  if [ "${codes[$i]}" = 124 ] || { [ -z "$closing" ] && [ -z "$summary" ]; }; then
    passed=$(grep -c ' PASSED' "$log"); failed=$(grep -cE ' (FAILED|ERROR)' "$log")
    reports=$(grep -cE '^========= (Error|Invalid|Race|Warning)' "$log")
    why="exit ${codes[$i]}"; [ "$limit" -gt 0 ] && why="$why, limit $limit s"
    closing="cut ($why): $passed passed, $failed failed before it"
    summary="sanitizer reports so far: $reports"
  fi
  # a -k that matches nothing still ends in the sanitizer's clean summary: say so, and fail
  # (session 66's `-k early_frame_small` selected 0 tests: the ids are ...[arch-small-...])
  if grep -qE 'collected [0-9]+ items / [0-9]+ deselected / 0 selected|no tests ran' "$log"; then
    closing="NO TESTS SELECTED (check -k): nothing was sanitized"
    status=1
  fi
  printf '%-40s %s | %s\n' "$(basename "$f")" "$closing" "$summary"
  i=$((i + 1))
done
exit "${status:-0}"
