#!/usr/bin/env bash
# Session 60, revised in session 61: the GPU tests owed since session 59. Session 61 ran the first
# part (host_roundtrip.cu's fan rows: the frame level stays; bench/h100/2026-12-06-s61/) and began
# the tests, which its 200 s limit cut after 18 of 41 cases passed, and added c and d. Four calls on
# an H100, from the repository root, after the wheel install (c first: it decides a default):
#   bash bench/pending/2026-12-06-s60/gpu13.sh a     (~450 s)
#   bash bench/pending/2026-12-06-s60/gpu13.sh b     (~100 s: 8 workers, as session 53's gpuA.sh ran them)
#   bash bench/pending/2026-12-06-s60/gpu13.sh c     (~540 s)
#   bash bench/pending/2026-12-06-s60/gpu13.sh d     (~450 s)
# a: the selection and Session tests (41 cases), which build through session 60's build-time change
#    (the schedule's enumerations kept across a build's tactics, shared_reads, needed_ranges, the
#    uncomposed program reused; every zoo kernel's source byte for byte the same on the CPU).
# b: session 58's stepkernel tests cut in sessions 59 and 60 (narrow weight rows, x in registers:
#    51 cases at ~4 s).
# c: issue 18, the frame's and the answer's trips. host_roundtrip.cu's rows added in session 61: a
#    zoo frame's 64 words polled by 2 or 4 staggered warps a word (a resident frame block sees its
#    words ~0.6 us after they land with one poller: up to ~0.5 us a step), outputs as tagged words
#    against fenced ones (frame+out was 1.3 us over frame: if that is the system fence, tagged
#    outputs take it off every step), and the fan rows over write-combined memory (if direct
#    polling from many blocks does not queue there, the frame level could go: ~0.9 us a step).
#    Then codegen.TAGGED_OUTPUTS itself (session 61, off by default, CPU-tested under emulation):
#    its GPU tests (bit for bit the plain kernel, launched and resident, both frame paths, the
#    check_finite path, the plan) and resident_variants.py's default against tagged-outputs
#    (launched and resident p50 / p99). Turn it on only if it is faster at p50 and p99 on every
#    arch timed, every test passes and d's sanitizers are clean.
# d: memcheck and racecheck of tagged outputs' small case (one after the other: two resident kernels
#    at once would each hold every SM and wait on blocks that never start). Then issue 18's p99 (target 15 us; the resident p99s were 12-22 us in the table): host_jitter.py with
#    session 61's split of each Session.step call into its wait on the done words (the GPU's side:
#    PCIe both ways and the kernel) and the host's work, under the four host conditions (as timed,
#    gc off, pinned, both): is the tail the kernel's or the host's, and does pinning or gc remove it?
# Each case's line goes to $OUT/g13/tests-CALL.log as it finishes, so a cut call still shows which passed.
set -u
call=${1:?which call: a b c d}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g13
case $call in
  a) tests=(tests/gpu/test_engine_fusion_gpu.py tests/gpu/test_session.py); limit=560 ;;
  b) tests=(-n 8 tests/gpu/test_stepkernel.py -k "narrow_weight_kernel_matches or x_in_registers"); limit=300 ;;  # correctness only: 8 at once
  c) echo "== host_roundtrip $(date +%T)"
     (cd bench/microbench && nvcc -O3 -arch=sm_90 -o /tmp/host_roundtrip host_roundtrip.cu) && \
       timeout 120 /tmp/host_roundtrip 20000 2>&1 | tee $OUT/g13/host_roundtrip.log
     echo "== tagged outputs: GPU tests $(date +%T)"
     timeout 280 python3 -m pytest -v -m gpu tests/gpu/test_resident.py -k tagged_outputs -p no:cacheprovider > $OUT/g13/tests-tagged.log 2>&1
     echo "rc=$? $(date +%T)"; grep -E " (PASSED|FAILED|ERROR)" $OUT/g13/tests-tagged.log | sed 's/.*:://' ; tail -2 $OUT/g13/tests-tagged.log
     echo "== resident_variants default,tagged-outputs $(date +%T)"
     timeout 220 python3 bench/microbench/resident_variants.py --archs gru,min_gru,attention,mamba --variants default,tagged-outputs \
       --rounds 3 --out $OUT/g13/resident_tagged.json 2>&1 | grep -v Warn | tee $OUT/g13/resident_tagged.log
     exit 0 ;;
  d) for tool in memcheck racecheck; do
       echo "== $tool: tagged outputs' small case $(date +%T)"
       FRAMEFUSE_RESIDENT_TIMEOUT_S=120 bash tests/gpu/sanitize.sh $tool $OUT/g13/san -t 140 -k tagged_outputs_small \
         tests/gpu/test_resident.py 2>&1 | tail -3
     done
     echo "== host_jitter $(date +%T)"
     timeout 160 python3 bench/microbench/host_jitter.py --archs gru,mamba --iters 10000 \
       --out $OUT/g13/host_jitter.json > $OUT/g13/host_jitter.log 2>&1; echo "rc=$? $(date +%T)"
     python3 -c "import json,sys; [print(r['what'], r['condition'], r['p50_us'], r['p99_us'], r.get('wait_p50_us'), r.get('wait_p99_us'), r.get('host_p50_us'), r.get('host_p99_us'), r.get('tail_wait_share')) for r in json.load(open(sys.argv[1]))['rows']]" $OUT/g13/host_jitter.json
     exit 0 ;;
  *) echo "unknown call $call" >&2; exit 2 ;;
esac
echo "== GPU tests $call $(date +%T)"
timeout $limit python3 -m pytest -v -m gpu "${tests[@]}" -p no:cacheprovider > $OUT/g13/tests-$call.log 2>&1
echo "rc=$? $(date +%T)"
grep -cE " PASSED" $OUT/g13/tests-$call.log; grep -E " (FAILED|ERROR)" $OUT/g13/tests-$call.log | head -20
tail -3 $OUT/g13/tests-$call.log
