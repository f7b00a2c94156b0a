#!/usr/bin/env bash
# device call O (H200, 2026-12-04): the session's one call (900 s of device time in all, start
# included). In order:
# 1. make gpu first, its core parts in a bounded budget: environment, speed-default (with its
#    kernels section), gpu-tests, precision-default (python -m profiling.gpu --only ... --budget);
# 2. NEXT (q's last batch issues k's first, c65c376) against the seam before it in the same tree
#    (ab.py, AB_NO_NEXT=1 turns launch.seam_next off): default, wan, hunyuan-video bf16, tuned;
# 3. copyprobe.py: a plain Triton copy with rome's walk, with and without default's fp32 tables,
#    against cudaMemcpy in the same run (what tells the ~0.95 of copy's DRAM rate that rome's
#    DRAM-bound launches measured from rome's own cost);
# 4. ncu of the partner form and the sections' pairs (bf16, fp32) with DRAM bytes and L2/L1 sectors.
# Everything is written under $OUT/r as it finishes (no archive at the end: a kill keeps what ran).
# Set up as runL.sh: profiling/results out of the index for the call, these scripts in .gpu/.
export PYTHONUNBUFFERED=1 ROME_COMMIT=$1 TRITON_PRINT_AUTOTUNING=1
R=$OUT/r; mkdir -p $R; T0=$(date +%s); S=${S:-.gpu}; END=${END:-560}
left() { echo $(( $1 - ($(date +%s) - T0) )); }
cap() { local t=$(left $1); [ $t -gt $2 ] && t=$2; echo $t; }
nvidia-smi > $R/nvidia-smi.txt 2>&1
timeout 230 python3 -m profiling.gpu --out $R/gpu --only environment,speed-default,gpu-tests,precision-default --budget 220 > $R/gpu.log 2>&1
echo "make gpu rc $? at $(( $(date +%s)-T0 )) s"; grep "make gpu" $R/gpu.log | cut -c1-240
for v in next nonext; do
  t=$(cap 345 58); [ $t -lt 15 ] && { echo "ab $v skipped: $t s left"; continue; }
  e=; [ $v = nonext ] && e=1
  AB_NO_NEXT=$e PYTHONPATH=.:$S timeout $t python3 $S/ab.py $v default,wan,hunyuan-video > $R/ab-$v.json 2> $R/ab-$v.log
  echo "ab $v rc $? at $(( $(date +%s)-T0 )) s"; grep -E "^\[" $R/ab-$v.log | cut -c1-200
done
for dt in bf16 fp32; do
  t=$(cap 440 50); [ $t -lt 15 ] && { echo "copyprobe $dt skipped: $t s left"; continue; }
  PYTHONPATH=.:$S timeout $t python3 $S/copyprobe.py $dt > $R/copyprobe-$dt.json 2> $R/copyprobe-$dt.log
  echo "copyprobe $dt rc $? at $(( $(date +%s)-T0 )) s"; grep " us, " $R/copyprobe-$dt.log | cut -c1-160
done
M=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_requests_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_write.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum,smsp__inst_executed.sum
for dt in bf16 fp32; do for f in partner pairs; do
  t=$(cap $END 55); [ $t -lt 20 ] && { echo "ncu $f $dt skipped: $t s left"; continue; }
  PYTHONPATH=. timeout $t ncu --clock-control none --profile-from-start off --kernel-name regex:gather \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SchedulerStats \
    --metrics $M python3 $S/pairsncu.py $f $dt > $R/ncu-$f-$dt.txt 2>&1
  echo "ncu $f $dt rc $? at $(( $(date +%s)-T0 )) s"
  grep -E "Duration|DRAM Throughput|Registers Per|dram__bytes|lts__t_(sectors|requests)|l1tex__t_(sectors|requests)" $R/ncu-$f-$dt.txt | cut -c1-160
done; done
echo "total $(( $(date +%s)-T0 )) s"
