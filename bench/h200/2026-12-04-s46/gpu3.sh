#!/usr/bin/env bash
# session 46, GPU call 3: resident vs launched bit for bit over 10,000 frames for every zoo
# architecture (tagged frames on), then the zoo's T = 1 rows with every peer (full settings).
set -u
export TORCHINDUCTOR_CACHE_DIR=$PWD/build/cache/inductor TRITON_CACHE_DIR=$PWD/build/cache/triton FRAMEFUSE_CACHE=$PWD/build/cache/ff
mkdir -p build/cache
echo "== 10000-frame tests $(date +%T)"
timeout ${T1:-200} python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_resident.py -k "10000" > $OUT/resident-10000.log 2>&1; echo "rc=$? $(date +%T)"; tail -n 4 $OUT/resident-10000.log
bash bench/h200/2026-11-28-s35/gpu_s29_rows.sh zoo zoo step ${ARCHS:-attention,lstm,gru,min_gru,min_lstm} ${T2:-360}
