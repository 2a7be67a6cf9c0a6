#!/usr/bin/env bash
# compute-sanitizer over GPU test files, one process per file, in parallel (the GPU has room;
# a sanitizer run is bound by its own per-launch instrumentation, not by the GPU).
#   tests/gpu/sanitize.sh TOOL OUT_DIR [-k EXPR] FILE...
# TOOL is memcheck or racecheck. Each file's log goes to OUT_DIR/<tool>-<file>.log; the last
# lines printed are one summary row per file (pytest's closing line and the sanitizer's summary).
# Long-T cases (T >= 1024) are deselected with -k when asked: under racecheck one such case
# takes minutes, and the short cases already cover every code path (chunk edges included).
set -uo pipefail
tool=$1; out=$2; shift 2
kexpr=()
if [ "${1:-}" = "-k" ]; then kexpr=(-k "$2"); shift 2; fi
mkdir -p "$out"
extra=()
[ "$tool" = memcheck ] && extra=(--report-api-errors no)  # cuda-bindings probes driver symbols
pids=()
for f in "$@"; do
  log="$out/$tool-$(basename "$f" .py).log"
  compute-sanitizer --tool "$tool" "${extra[@]}" python3 -m pytest -q -p no:cacheprovider "${kexpr[@]}" "$f" >"$log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for f in "$@"; do
  log="$out/$tool-$(basename "$f" .py).log"
  printf '%-40s %s | %s\n' "$(basename "$f")" \
    "$(grep -E '(passed|failed|error)' "$log" | grep -E ' in [0-9.]+s' | tail -n 1)" \
    "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 1)"
done
