#!/usr/bin/env bash
# device call E: the fused QK-norm rows at HEAD, ncu of its kernels, then make gpu's parts not yet run
export PYTHONUNBUFFERED=1 ROME_COMMIT=$1
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
nvidia-smi > $R/nvidia-smi.txt 2>&1
PYTHONPATH=.:profiling/results/h100/scripts timeout 100 python3 profiling/results/h100/scripts/qk.py > $R/qk.json 2> $R/qk.log; grep "^\[" $R/qk.log; tail -2 $R/qk.log; echo "qk at $(( $(date +%s)-T0 )) s"
for w in wan-qknorm flux-qknorm; do
  PYTHONPATH=. timeout 60 ncu --clock-control none --profile-from-start off --kernel-name regex:gather --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats python3 profiling/results/h100/scripts/qkncu.py $w > $R/ncu-$w.txt 2>&1; echo "ncu $w rc $? at $(( $(date +%s)-T0 )) s"
done
timeout 250 python3 -m profiling.gpu --only speed-decode,gpu-tests,ncu --budget 240 > $R/gpu.log 2>&1; echo "gpu rc $? at $(( $(date +%s)-T0 )) s"; grep "make gpu" $R/gpu.log | tail -8
cp -r profiling/results/h100 $R/h100
cd $OUT && tar czf r.tgz r && rm -rf r; echo "total $(( $(date +%s)-T0 )) s"
