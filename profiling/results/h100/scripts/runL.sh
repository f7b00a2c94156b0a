#!/usr/bin/env bash
# device call L (H200, 2026-12-04): issue 27's sections' pairs as halves (75ef6e4, a8e7b9b), the
# first kernel of theirs on a GPU. First the new builds' tests on CUDA (the pairs and the whole head's
# halves), then ab.py on this tree against a471782 (the last kernel measured on an H200,
# ../../h200/ab-kept-442bbd0/), two rounds, the trees alternating, the autotuner's picks printed;
# then the rest of the gather kernel's tests and make gpu's environment and gpu-tests parts with
# what is left. Everything stops by its own clock so that the one archive under $OUT is written.
# Before the call, from the repository root (the tree under the tool's 64 MiB: profiling/results
# taken out of the index for the call, these scripts copied to the untracked .gpu/):
#   mkdir .ab-a471782 && git archive a471782 rome | tar x -C .ab-a471782
#   mkdir .gpu && cp profiling/results/h100/scripts/{ab.py,runL.sh} .gpu/
export PYTHONUNBUFFERED=1 ROME_COMMIT=$1 TRITON_PRINT_AUTOTUNING=1
R=/tmp/r; mkdir -p $R; T0=$(date +%s); S=${S:-.gpu}; END=${END:-440}
left() { echo $(( $1 - ($(date +%s) - T0) )); }
cap() { local t=$(left $1); [ $t -gt $2 ] && t=$2; echo $t; }
nvidia-smi > $R/nvidia-smi.txt 2>&1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
t=$(cap 110 110); PYTHONPATH=. timeout $t python3 -m pytest -q --maxfail=3 tests/test_gather_kernel.py -k "pairs_take or whole_heads" -p no:cacheprovider > $R/tests-pairs.log 2>&1
echo "pairs tests rc $? at $(( $(date +%s)-T0 )) s"; tail -4 $R/tests-pairs.log | cut -c1-300
W=default,default:fp32,default:fp16,wan,llama-1d,decode,llama-1d:fp32
for round in 1 2; do for v in head a471782; do
  p=.; [ $v != head ] && p=.ab-$v
  lim=85; [ $round = 2 ] && lim=55
  t=$(cap 400 $lim); [ $t -lt 20 ] && { echo "ab $v $round skipped: $t s left"; continue; }
  PYTHONPATH=$p:$S timeout $t python3 $S/ab.py $v $W > $R/ab-$v-$round.json 2> $R/ab-$v-$round.log
  echo "ab $v round $round rc $? at $(( $(date +%s)-T0 )) s"; grep -E "^\[" $R/ab-$v-$round.log | cut -c1-200
done; done
grep -h -E "best config" $R/ab-*-1.log | sort | uniq -c | cut -c1-260 | head -30
t=$(left $((END-45))); [ $t -gt 20 ] && { PYTHONPATH=. timeout $t python3 -m pytest -q --maxfail=5 tests/test_gather_kernel.py -k "not pairs_take and not whole_heads" -p no:cacheprovider > $R/tests-gather.log 2>&1; echo "gather tests rc $? at $(( $(date +%s)-T0 )) s"; tail -4 $R/tests-gather.log | cut -c1-300; }
t=$(left $END); [ $t -gt 15 ] && { timeout $t python3 -m profiling.gpu --out $R/gpu --only environment,gpu-tests --budget $((t-5)) > $R/gpu.log 2>&1; echo "gpu rc $? at $(( $(date +%s)-T0 )) s"; grep "make gpu" $R/gpu.log | cut -c1-240; }
cd /tmp && tar czf $OUT/r.tgz r; echo "total $(( $(date +%s)-T0 )) s"
