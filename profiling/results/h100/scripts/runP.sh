#!/usr/bin/env bash
# device call P (H200, 2026-12-04, after call O in the same session): the walk. Call O's copy probes
# put a plain Triton copy with rome's walk and default's tables (every head of q then k a program,
# the tables read once) at 92.5% (bf16) of the q/k copy's time, and rome's default at 91.7%: so
# first, whether fewer heads a program (the tables reread from L2 a group) moves the probe
# (copyprobe.py DT groups), then rome's default bf16 with launch.PROGRAMS_PER_SM raised
# (ab.py, AB_PPS: 8 is rome's; 32/128 give 12-24 and 5-8 heads a program), at choose()'s tile.
# Outputs in one archive ($OUT/p.tgz) and the lines on stdout.
export PYTHONUNBUFFERED=1 ROME_COMMIT=$1 ROME_AUTOTUNE=0
R=/tmp/p; mkdir -p $R; T0=$(date +%s); S=${S:-.gpu}; END=${END:-150}
left() { echo $(( $1 - ($(date +%s) - T0) )); }
cap() { local t=$(left $1); [ $t -gt $2 ] && t=$2; echo $t; }
for dt in bf16 fp32; do
  t=$(cap 90 42); [ $t -lt 10 ] && { echo "copyprobe $dt skipped"; continue; }
  PYTHONPATH=.:$S timeout $t python3 $S/copyprobe.py $dt groups > $R/cp-$dt.json 2> $R/cp-$dt.log
  echo "copyprobe $dt groups rc $? at $(( $(date +%s)-T0 )) s"; grep " us, " $R/cp-$dt.log | cut -c1-170
done
for pps in 8 32 128; do
  t=$(cap $END 22); [ $t -lt 8 ] && { echo "ab pps $pps skipped"; continue; }
  AB_PPS=$pps PYTHONPATH=.:$S timeout $t python3 $S/ab.py pps$pps default > $R/ab-pps$pps.json 2> $R/ab-pps$pps.log
  echo "ab pps $pps rc $? at $(( $(date +%s)-T0 )) s"; grep -E "^\[" $R/ab-pps$pps.log | cut -c1-200
done
cd /tmp && tar czf $OUT/p.tgz p; echo "total $(( $(date +%s)-T0 )) s"
