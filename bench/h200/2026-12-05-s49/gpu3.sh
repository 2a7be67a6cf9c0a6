#!/usr/bin/env bash
# session 49, GPU call 3: where the LSTM windows that tie cuDNN spend their time (device time of the
# step compiler's kernel by block size, the per-task timeline), then the three bidirectional
# torch.nn models at T = 32 with every peer in the same run.
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache $OUT/sweep $OUT/tests
echo "== native host path tests $(date +%T)"
timeout 100 python3 -m pytest -m gpu -q -n 4 -p no:cacheprovider -rfE tests/gpu/test_session.py -k native_host \
  > $OUT/tests/native-host-tests.log 2>&1; echo "rc=$? $(date +%T)"; tail -n 3 $OUT/tests/native-host-tests.log
echo "== threads sweep $(date +%T)"
timeout 150 python3 bench/stepkernel.py --archs , --sweep rnn:LSTM/64/256/1,rnn:LSTM/1024/32/2,rnn:GRU/64/256/1 \
  --grids 132 --threads 256,512,1024 --out $OUT/sweep > $OUT/sweep/sweep.log 2>&1; echo "rc=$? $(date +%T)"
grep -E "sweep " $OUT/sweep/sweep.log
bash bench/h200/2026-11-28-s35/gpu_s29_rows.sh real32t real sequence torch_lstm_bidir,torch_gru_bidir 200
