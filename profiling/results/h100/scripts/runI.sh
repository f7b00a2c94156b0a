#!/usr/bin/env bash
# device call I (prepared 2026-11-28, not yet run): the per-head RMSNorm prologue's register cap,
# 128 (f08b5be) against 168 (before), on the per-head *-qknorm workloads (normcap.py: alternating
# rounds, a copy of the same bytes, the two caps' outputs compared bit for bit); then the fused
# forms as forms-f1c73eb measured them, for the model's before/after (qk.py)
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
nvidia-smi > $R/nvidia-smi.txt 2>&1
S=profiling/results/h100/scripts
PYTHONPATH=.:$S timeout 150 python3 $S/normcap.py qwen3-qknorm,flux-qknorm 3 > $R/normcap.json 2> $R/normcap.log; echo "normcap rc $? at $(( $(date +%s)-T0 )) s"; grep "^\[" $R/normcap.log
PYTHONPATH=.:$S timeout 150 python3 $S/qk.py qwen3-qknorm,flux-qknorm > $R/qk.json 2> $R/qk.log; echo "qk rc $? at $(( $(date +%s)-T0 )) s"; tail -3 $R/qk.log | cut -c1-200
cd $OUT && tar czf r.tgz r && rm -rf r; echo "total $(( $(date +%s)-T0 )) s"
