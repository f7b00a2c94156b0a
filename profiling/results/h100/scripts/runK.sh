#!/usr/bin/env bash
# device call K (prepared 2026-11-28, not yet run): why the fp32 forward measured 84-87 % of copy at
# 797a8d4 and 93-94 % at a471782 with the same SASS (../../h200/ab-kept-442bbd0/): the autotuner's
# timings and pick, printed, for both trees, bf16 and fp32; then make gpu's parts call J left
# (precision-default, gpu-tests, ncu). Before the call, from the repository root:
#   mkdir .ab-pre-kept-797a8d4 && git archive 797a8d4 rome | tar x -C .ab-pre-kept-797a8d4
#   mkdir .ab-pre-dot-f56662f && git archive f56662f rome | tar x -C .ab-pre-dot-f56662f
# (and a tree under the tool's 64 MiB: see README.md here). First (added 2026-11-29): the head
# groups' dot before and after its wide tile (../../cpu/dot-wide/: 64 rows x 16 warps, two heads a
# batch on sm_90; the model says default 61 -> 77 % of an H200's copy forward), bf16, both trees.
export PYTHONUNBUFFERED=1 ROME_COMMIT=$1 TRITON_PRINT_AUTOTUNING=1
R=$OUT/r; mkdir -p $R; T0=$(date +%s); S=profiling/results/h100/scripts
nvidia-smi > $R/nvidia-smi.txt 2>&1
for v in head pre-dot-f56662f; do
  p=.; [ $v != head ] && p=.ab-$v
  PYTHONPATH=$p:$S timeout 90 python3 $S/ab.py $v-dot default:bf16:dot,wan:bf16:dot,llama-1d:bf16:dot,default > $R/ab-$v-dot.json 2> $R/ab-$v-dot.log
  echo "ab $v dot rc $? at $(( $(date +%s)-T0 )) s"; grep -E "^\[" $R/ab-$v-dot.log | cut -c1-220
done
for round in 1 2; do for v in head pre-kept-797a8d4; do
  p=.; [ $v != head ] && p=.ab-$v
  PYTHONPATH=$p:$S timeout 60 python3 $S/ab.py $v default:fp32,llama-1d:fp32,default > $R/ab-$v-$round.json 2> $R/ab-$v-$round.log
  echo "ab $v round $round rc $? at $(( $(date +%s)-T0 )) s"; grep -E "^\[|best config|Triton autotuning" $R/ab-$v-$round.log | cut -c1-220
done; done
timeout 250 python3 -m profiling.gpu --out $R/gpu --only environment,gpu-tests,precision-default,ncu --budget 240 > $R/gpu.log 2>&1
echo "gpu rc $? at $(( $(date +%s)-T0 )) s"; grep "make gpu" $R/gpu.log | cut -c1-240
cd $R && tar czf gpu.tgz gpu && rm -rf gpu; echo "total $(( $(date +%s)-T0 )) s"
