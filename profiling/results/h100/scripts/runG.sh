#!/usr/bin/env bash
# device call G (2026-11-27, one call): make gpu's environment, gpu-tests, speed-default and
# speed-decode parts into a copy of results/h100 (only the files it wrote come back); then every
# form of the q/k op against copy on the static model's workloads (forms.py, issue 27), and the
# fused QK-norm rows with the token tile (qk.py, issue 29)
export PYTHONUNBUFFERED=1 ROME_COMMIT=$1
R=$OUT/r; mkdir -p $R; T0=$(date +%s)
nvidia-smi > $R/nvidia-smi.txt 2>&1
cp -r profiling/results/h100 $R/h100; touch $R/marker; sleep 1
timeout 300 python3 -m profiling.gpu --out $R/h100 --only environment,gpu-tests,speed-default,speed-decode --budget 285 > $R/gpu.log 2>&1; echo "gpu rc $? at $(( $(date +%s)-T0 )) s"; grep "make gpu\|^| " $R/gpu.log | tail -8
S=profiling/results/h100/scripts
PYTHONPATH=.:$S timeout 170 python3 $S/forms.py default,llama-1d,wan,hunyuan-video,decode tables,dot,at,angles bfloat16 > $R/forms.json 2> $R/forms.log; echo "forms rc $? at $(( $(date +%s)-T0 )) s"; grep "^\[" $R/forms.log | cut -c1-150; tail -2 $R/forms.log | cut -c1-300
PYTHONPATH=.:$S timeout 100 python3 $S/qk.py wan-qknorm,flux-qknorm,qwen3-qknorm > $R/qk.json 2> $R/qk.log; echo "qk rc $? at $(( $(date +%s)-T0 )) s"; grep "^\[" $R/qk.log | cut -c1-400; tail -2 $R/qk.log | cut -c1-300
cd $R && find h100 -type f -newer marker > changed.txt && tar czf $OUT/gpu.tgz -T changed.txt && rm -rf h100 && cd $OUT && tar czf r.tgz r && rm -rf r; ls -la $OUT; echo "total $(( $(date +%s)-T0 )) s"
