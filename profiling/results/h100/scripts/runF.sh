#!/usr/bin/env bash
# device call F: the over-heads norm's sweep order and backward tile (tiles.py, HEAD~ = .base3 vs
# this tree), the fused QK-norm rows (qk.py), ncu of the new wan kernels, every entry point compiled and run
export PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
nvidia-smi > $R/nvidia-smi.txt 2>&1
PYTHONPATH=.base3 timeout 45 python3 profiling/results/h100/scripts/tiles.py base > $R/tiles-base.json 2> $R/tiles-base.log; grep "^\[" $R/tiles-base.log; tail -1 $R/tiles-base.log | cut -c1-300; echo "base at $(( $(date +%s)-T0 )) s"
PYTHONPATH=. timeout 90 python3 profiling/results/h100/scripts/tiles.py new 8x4,8x8,4x4,4x2,2x2 > $R/tiles-new.json 2> $R/tiles-new.log; grep "^\[" $R/tiles-new.log; tail -1 $R/tiles-new.log | cut -c1-300; echo "new at $(( $(date +%s)-T0 )) s"
PYTHONPATH=. timeout 60 python3 -m profiling.gpu _entry_points cuda > $R/entry-points.log 2>&1; echo "entry rc $? at $(( $(date +%s)-T0 )) s"; grep -c "^ok" $R/entry-points.log; grep "^error" $R/entry-points.log | cut -c1-200
PYTHONPATH=.:profiling/results/h100/scripts timeout 60 python3 profiling/results/h100/scripts/qk.py wan-qknorm,flux-qknorm > $R/qk.json 2> $R/qk.log; grep "^\[" $R/qk.log; echo "qk at $(( $(date +%s)-T0 )) s"
PYTHONPATH=. timeout 30 ncu --clock-control none --profile-from-start off --kernel-name regex:gather --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis python3 profiling/results/h100/scripts/qkncu.py wan-qknorm > $R/ncu-wan-qknorm.txt 2>&1; echo "ncu rc $? at $(( $(date +%s)-T0 )) s"; grep -E "Duration|DRAM Throughput|L2 Hit|L1/TEX Hit|Registers Per|Achieved Occ" $R/ncu-wan-qknorm.txt
cd $OUT && tar czf r.tgz r && rm -rf r; echo "total $(( $(date +%s)-T0 )) s"
