#!/usr/bin/env bash
# Session 68 (~480 s, one call on an H100): the frame block's go (codegen.RESIDENT_FRAMER_GO, new in
# session 68: the frame block publishes the go once its words are in; the leader takes that go or
# its bell). g34's resident traces had the frame block through its task 1.8-2.6 us before the other
# blocks had the leader's go (mamba, xlstm, attention).
# 1. resident_variants, 11 zoo archs, default (framer go) against leader-go (session 67's default), 2 rounds
# 2. the resident traces of mamba and xlstm again, with the framer's go
# 3. tests/gpu/test_resident.py: every zoo arch against ONNX Runtime and bit for bit the launched
#    kernel over 10,000 frames, with the framer's go
set -u
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/g35
echo "== resident, 11 archs, framer go / leader go $(date +%T)"
timeout 240 python3 bench/microbench/resident_variants.py \
  --archs min_gru,min_lstm,gru,lstm,gated_ssm,attention,liquid,jamba,delta_net,mamba,xlstm --rounds 2 \
  --variants default,leader-go --out $OUT/g35/resident.json 2>&1 \
  | grep -v -e Warn -e "session = Session" | tee $OUT/g35/resident.log
echo "== resident traces, framer go $(date +%T)"
timeout 90 python3 bench/stepkernel.py --archs , --trace-resident mamba,xlstm --select stepkernel-fewer-phases \
  --out $OUT/g35/traces 2>&1 | grep -e "^trace-resident" -e Error | tee $OUT/g35/traces.log
echo "== test_resident $(date +%T)"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu/test_resident.py \
  -k "matches_onnxruntime or bit_for_bit" > $OUT/g35/test_resident.log 2>&1
echo "rc=$? $(date +%T)"; grep -E "^(FAILED|ERROR)" $OUT/g35/test_resident.log | cut -c1-200; tail -n 1 $OUT/g35/test_resident.log
