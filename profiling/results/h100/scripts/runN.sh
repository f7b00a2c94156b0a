#!/usr/bin/env bash
# device call N (prepared 2026-12-04, not yet run): why the sections' pairs as halves measured 1-5
# points slower than the partner form on an H200 where the model said 2-4 faster
# (../../h200/ab-pairs-a8e7b9b/). The model's SM-side schedule cannot explain it: fp32's pairs idle
# at 2.3x copy and still measured 5 points below, and counting their gathered loads' L1 wavefronts
# 2-3x moves the model by 0.1-0.6 points (profiling/results/cpu/pairs-why/). So, in order of value:
# 0. copy probes (copyprobe.py): a plain Triton kernel with rome's walk, with and without default's
#    tables, against cudaMemcpy in the same run: what a copy with rome's walk reaches, which tells
#    the ~0.95 of copy that rome's DRAM-bound launches measured (pairs-why section 4) from rome's
#    own cost;
# 0b. NEXT (q's last batch issues k's first, c65c376) against the seam before it (AB_NO_NEXT=1,
#    launch.seam_next off), the same tree: default, wan, hunyuan-video bf16, tuned;
# 1. both forms at choose()'s tile (ROME_AUTOTUNE=0, the model's build) and tuned (ab.py records
#    the tile the tuner picked; call M did not print it); the tuned partner run also measures
#    hunyuan-video fp32 (never measured on a GPU; bf16 in 0b);
# 2. ncu of both forms' forward and backward on default, bf16 and fp32 (pairsncu.py), with the DRAM
#    bytes read/written and the L2/L1 sectors and requests of loads and stores (partial sectors,
#    a read-modify-write, twice the requests: what tells a memory-side cost from an SM-side one);
# 3. the pairs' tests on CUDA that call M did not reach.
# Set up as runL.sh (.gpu/ holding this folder's ab.py, pairsncu.py, copyprobe.py and this script);
# run with timeout_s 595 (END 585: what does not fit is skipped, the tests first).
export PYTHONUNBUFFERED=1 ROME_COMMIT=$1 TRITON_PRINT_AUTOTUNING=1
R=/tmp/r; mkdir -p $R; T0=$(date +%s); S=${S:-.gpu}; END=${END:-585}
left() { echo $(( $1 - ($(date +%s) - T0) )); }
cap() { local t=$(left $1); [ $t -gt $2 ] && t=$2; echo $t; }
for dt in bf16 fp32; do
  t=$(cap 100 50); [ $t -lt 15 ] && { echo "copyprobe $dt skipped: $t s left"; continue; }
  PYTHONPATH=.:$S timeout $t python3 $S/copyprobe.py $dt > $R/copyprobe-$dt.json 2> $R/copyprobe-$dt.log
  echo "copyprobe $dt rc $? at $(( $(date +%s)-T0 )) s"; grep " us, " $R/copyprobe-$dt.log | cut -c1-160
done
for v in next nonext; do  # NEXT (c65c376) against the seam before it, the same tree, tuned
  t=$(cap 210 55); [ $t -lt 15 ] && { echo "ab $v skipped: $t s left"; continue; }
  e=; [ $v = nonext ] && e=1
  AB_NO_NEXT=$e PYTHONPATH=.:$S timeout $t python3 $S/ab.py $v default,wan,hunyuan-video > $R/ab-$v.json 2> $R/ab-$v.log
  echo "ab $v rc $? at $(( $(date +%s)-T0 )) s"; grep -E "^\[" $R/ab-$v.log | cut -c1-200
done
W=default,default:fp32
for tune in 0 1; do for v in pairs partner; do
  t=$(cap 410 50); [ $t -lt 15 ] && { echo "ab $v tune $tune skipped: $t s left"; continue; }
  e=; [ $v = pairs ] && e=1
  w=$W; [ $v$tune = partner1 ] && w=$W,hunyuan-video:fp32  # (never measured before)
  ROME_AUTOTUNE=$tune AB_PAIRS=$e PYTHONPATH=.:$S timeout $t python3 $S/ab.py $v-tune$tune $w > $R/ab-$v-tune$tune.json 2> $R/ab-$v-tune$tune.log
  echo "ab $v tune $tune rc $? at $(( $(date +%s)-T0 )) s"; grep -E "^\[" $R/ab-$v-tune$tune.log | cut -c1-200
  grep -A3 '"tuned"' $R/ab-$v-tune$tune.json | cut -c1-200
done; done
M=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_write.sum,lts__t_requests_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_write.sum,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_requests_pipe_lsu_mem_global_op_st.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum,smsp__inst_executed.sum
for dt in bf16 fp32; do for f in partner pairs; do
  t=$(cap 575 60); [ $t -lt 20 ] && { echo "ncu $f $dt skipped: $t s left"; continue; }
  PYTHONPATH=. timeout $t ncu --clock-control none --profile-from-start off --kernel-name regex:gather \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section SchedulerStats \
    --section InstructionStats --metrics $M python3 $S/pairsncu.py $f $dt > $R/ncu-$f-$dt.txt 2>&1
  echo "ncu $f $dt rc $? at $(( $(date +%s)-T0 )) s"
  grep -E "Duration|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Block Size|Grid Size|dram__bytes|lts__t_(sectors|requests)|launches" $R/ncu-$f-$dt.txt | cut -c1-160
done; done
t=$(cap $((END-5)) 120); PYTHONPATH=. timeout $t python3 -m pytest -q --maxfail=3 tests/test_gather_kernel.py -k "pairs_take" -p no:cacheprovider > $R/tests-pairs.log 2>&1
echo "pairs tests rc $? at $(( $(date +%s)-T0 )) s"; tail -3 $R/tests-pairs.log | cut -c1-250
cd /tmp && tar czf $OUT/n.tgz r; echo "total $(( $(date +%s)-T0 )) s"
