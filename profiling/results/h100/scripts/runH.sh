#!/usr/bin/env bash
# device call H (2026-11-27): the angles form at choose_gather's half rows (ANGLE_FULL_ROWS=0, the
# kernel of call G) and at full rows outside a decode step's SEAM build (=1), each process timing
# the tables form too (the same run's reference and bitwise check), on the model's workloads
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
nvidia-smi > $R/nvidia-smi.txt 2>&1
S=profiling/results/h100/scripts
for f in 0 1; do
  ANGLE_FULL_ROWS=$f PYTHONPATH=.:$S timeout 75 python3 $S/forms.py default,wan,llama-1d,decode tables,angles bfloat16 > $R/rows$f.json 2> $R/rows$f.log; echo "rows$f rc $? at $(( $(date +%s)-T0 )) s"; grep "^\[" $R/rows$f.log | cut -c1-170; tail -1 $R/rows$f.log | cut -c1-200
done
cd $OUT && tar czf r.tgz r && rm -rf r; echo "total $(( $(date +%s)-T0 )) s"
