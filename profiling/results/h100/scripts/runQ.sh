#!/usr/bin/env bash
# device call Q (prepared 2026-12-04 after calls O and P, not yet run): make gpu's first parts in
# their new order and limits (18b2bd5, 8d95c88), then whether a Triton copy can come nearer memcpy than calls
# O/P's flat copy (0.959-0.972 of memcpy's rate: block sizes, warps, evict-first loads and streaming
# stores, a persistent grid; copyprobe.py DT forms), what default's bytes leave with the tables in x's dtype (as
# transformers passes them: 98.0 % of the q/k copy by bytes where fp32 tables leave 96.0 %), and
# rome's default with its tables in bf16 (ab.py, AB_TABLES=x) beside fp32 tables, tuned, same run;
# the SM clock sampled throughout (clocks.csv). Added after make gpu (2026-12-04, later session),
# before the probes, which come after it only as time allows: ncu of default's bf16 partner form
# and wan's, forward and backward (pairsncu.py partner bf16 default,wan), with the GPU's own clocks: the SM clock, the issue
# slots used and the instructions executed, what the static model's worst end charges default for
# (profiling/results/cpu/bound-default-bf16/).
# Set up as runL.sh (profiling/results out of the index, these scripts in .gpu/: ab.py, copyprobe.py,
# pairsncu.py, runQ.sh); run with
# timeout_s 590. The tool returns at most 8 files: everything goes into one archive, $OUT/q.tgz,
# rewritten after every step, so a kill keeps what ran.
export PYTHONUNBUFFERED=1 ROME_COMMIT=$1 TRITON_PRINT_AUTOTUNING=1
R=/tmp/q; mkdir -p $R; T0=$(date +%s); S=${S:-.gpu}; END=${END:-570}
left() { echo $(( $1 - ($(date +%s) - T0) )); }
cap() { local t=$(left $1); [ $t -gt $2 ] && t=$2; echo $t; }
keep() { (cd /tmp && tar czf $OUT/q.tgz q); }
nvidia-smi > $R/nvidia-smi.txt 2>&1
# the clocks through the whole call (which of the model's clock ends the A/B and probes ran at;
# make gpu's report keeps its own over its timings): stopped before the last archive
$(command -v stdbuf > /dev/null && echo stdbuf -oL) nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv --loop-ms=100 > $R/clocks.csv 2> $R/clocks.err &
SMI=$!
timeout 400 python3 -m profiling.gpu --out $R/gpu --only environment,speed-default,gpu-tests,precision-default --budget 390 > $R/gpu.log 2>&1
echo "make gpu rc $? at $(( $(date +%s)-T0 )) s"; grep "make gpu" $R/gpu.log | cut -c1-240; keep
t=$(cap $((END-20)) 120)
if [ $t -ge 40 ]; then
  PYTHONPATH=.:$S timeout $t ncu --clock-control none --profile-from-start off --kernel-name regex:gather \
    --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section LaunchStats \
    --metrics gpc__cycles_elapsed.avg.per_second,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__bytes_read.sum,dram__bytes_write.sum,gpu__time_duration.sum \
    python3 $S/pairsncu.py partner bf16 default,wan > $R/ncu-issue.txt 2>&1
  echo "ncu rc $? at $(( $(date +%s)-T0 )) s"
  grep -E "^  _rome|SM Frequency|Duration  |Issued Warp|sm__inst_executed.sum|smsp__issue_active|launches \(" $R/ncu-issue.txt | cut -c1-160; keep
else echo "ncu skipped: $t s left"; fi
for dt in bf16 fp32; do
  t=$(cap $((END-50)) 45); [ $t -lt 10 ] && { echo "copyprobe $dt skipped"; continue; }
  PYTHONPATH=.:$S timeout $t python3 $S/copyprobe.py $dt forms > $R/cp-$dt.json 2> $R/cp-$dt.log
  echo "copyprobe $dt forms rc $? at $(( $(date +%s)-T0 )) s"; grep -E " us, |error" $R/cp-$dt.log | cut -c1-170; keep
done
for v in fp32tables xtables; do
  t=$(cap $END 25); [ $t -lt 10 ] && { echo "ab $v skipped"; continue; }
  e=; [ $v = xtables ] && e=x
  AB_TABLES=$e PYTHONPATH=.:$S timeout $t python3 $S/ab.py $v default > $R/ab-$v.json 2> $R/ab-$v.log
  echo "ab $v rc $? at $(( $(date +%s)-T0 )) s"; grep -E "^\[" $R/ab-$v.log | cut -c1-200; keep
done
kill -INT $SMI 2>/dev/null; sleep 1; keep
echo "clocks: $(( $(wc -l < $R/clocks.csv) - 1 )) samples, SM MHz min/median/max $(cut -d, -f2 $R/clocks.csv | grep -o '[0-9]*' | sort -n | awk '{a[NR]=$1} END {if (NR) print a[1], a[int((NR+1)/2)], a[NR]}')"
echo "total $(( $(date +%s)-T0 )) s"
