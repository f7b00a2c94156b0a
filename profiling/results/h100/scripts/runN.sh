#!/usr/bin/env bash
# device call N (prepared 2026-12-04, not yet run): why the sections' pairs as halves measured 1-5
# points slower than the partner form on an H200 where the model said 2-4 faster
# (../../h200/ab-pairs-a8e7b9b/): ncu of both forms' forward and backward on default, bf16 and
# fp32 (pairsncu.py), the sections that tell issue, L1 wavefronts and occupancy apart; then the
# pairs' tests on CUDA that call M did not reach. Set up as runL.sh (.gpu/ holding this folder's
# pairsncu.py and this script).
export PYTHONUNBUFFERED=1 ROME_COMMIT=$1
R=/tmp/r; mkdir -p $R; T0=$(date +%s); S=${S:-.gpu}
for dt in bf16 fp32; do for f in partner pairs; do
  PYTHONPATH=. timeout 60 ncu --clock-control none --profile-from-start off --kernel-name regex:gather \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SchedulerStats \
    --section InstructionStats python3 $S/pairsncu.py $f $dt > $R/ncu-$f-$dt.txt 2>&1
  echo "ncu $f $dt rc $? at $(( $(date +%s)-T0 )) s"
  grep -E "Duration|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|L1/TEX Hit|Warp Cycles Per Issued|launches" $R/ncu-$f-$dt.txt | cut -c1-160
done; done
PYTHONPATH=. timeout 150 python3 -m pytest -q --maxfail=3 tests/test_gather_kernel.py -k "pairs_take" -p no:cacheprovider > $R/tests-pairs.log 2>&1
echo "pairs tests rc $? at $(( $(date +%s)-T0 )) s"; tail -3 $R/tests-pairs.log | cut -c1-250
cd /tmp && tar czf $OUT/n.tgz r; echo "total $(( $(date +%s)-T0 )) s"
