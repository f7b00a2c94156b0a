#!/usr/bin/env bash
# device call J (H200, 2026-11-28): make gpu first (its speed, tests, precision and ncu parts on
# default and llama-1d), then the kernel A/B of issue 27: this tree against 797a8d4 (before the
# kept pairs' 16-byte runs) and 6d523e5 (the last kernel measured on an H200), bf16 and fp32 q/k,
# each tree in its own process (ab.py); then the gather kernel's tests on CUDA with what is left.
# Files are left as they are under $OUT, so a run stopped by its limit still returns them.
export PYTHONUNBUFFERED=1 ROME_COMMIT=$1
R=$OUT/r; mkdir -p $R; T0=$(date +%s); S=profiling/results/h100/scripts
left() { echo $(( $1 - ($(date +%s) - T0) )); }
nvidia-smi > $R/nvidia-smi.txt 2>&1
timeout 290 python3 -m profiling.gpu --out $R/h200 --only environment,speed-default,speed-llama-1d,gpu-tests,precision-default,ncu --budget 280 > $R/gpu.log 2>&1
echo "gpu rc $? at $(( $(date +%s)-T0 )) s"; grep "make gpu" $R/gpu.log | cut -c1-240
W=default,llama-1d,wan,decode,llama-1d:fp32,default:fp32
for v in head pre-kept-797a8d4 h200-6d523e5; do
  p=.; [ $v != head ] && p=.ab-$v
  t=$(left 500); [ $t -lt 20 ] && { echo "ab $v skipped: ${t} s left"; continue; }
  [ $t -gt 75 ] && t=75
  PYTHONPATH=$p:$S timeout $t python3 $S/ab.py $v $W > $R/ab-$v.json 2> $R/ab-$v.log; echo "ab $v rc $? at $(( $(date +%s)-T0 )) s"; grep "^\[" $R/ab-$v.log
done
t=$(left 555); [ $t -gt 20 ] && { PYTHONPATH=. timeout $t python3 -m pytest -q -x tests/test_gather_kernel.py -p no:cacheprovider > $R/tests-gather.log 2>&1; echo "gather tests rc $? at $(( $(date +%s)-T0 )) s"; tail -3 $R/tests-gather.log; }
echo "total $(( $(date +%s)-T0 )) s"
