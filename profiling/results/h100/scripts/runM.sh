#!/usr/bin/env bash
# device call M (H200, 2026-12-04), after call L: the sections' pairs (HALVES_RUN) against the same
# tree's partner form (ab.py with AB_PARTNER=1: launch.partner_form() over the whole run, the
# backward too), default's 44/44/40 in bf16, fp32 and fp16, two rounds alternating; first the
# HALVES builds' tests on CUDA with the tests' GPU fixes (five heads a group where a GPU's groups
# would walk three). Set up as runL.sh (.gpu/ holding ab.py and this script).
export PYTHONUNBUFFERED=1 ROME_COMMIT=$1
R=/tmp/r; mkdir -p $R; T0=$(date +%s); S=${S:-.gpu}; END=${END:-280}
left() { echo $(( $1 - ($(date +%s) - T0) )); }
cap() { local t=$(left $1); [ $t -gt $2 ] && t=$2; echo $t; }
t=$(cap 110 110); PYTHONPATH=. timeout $t python3 -m pytest -q --maxfail=5 tests/test_gather_kernel.py -k "pairs_take or whole_heads or forwards_product" -p no:cacheprovider > $R/tests-halves.log 2>&1
echo "halves tests rc $? at $(( $(date +%s)-T0 )) s"; grep -E "^(FAILED|E )" $R/tests-halves.log | head -12 | cut -c1-250; tail -1 $R/tests-halves.log
W=default,default:fp32,default:fp16
for round in 1 2; do for v in pairs partner; do
  lim=60; [ $round = 2 ] && lim=35
  t=$(cap $((END-10)) $lim); [ $t -lt 15 ] && { echo "ab $v $round skipped: $t s left"; continue; }
  e=; [ $v = partner ] && e=1
  AB_PARTNER=$e PYTHONPATH=.:$S timeout $t python3 $S/ab.py $v $W > $R/ab-$v-$round.json 2> $R/ab-$v-$round.log
  echo "ab $v round $round rc $? at $(( $(date +%s)-T0 )) s"; grep -E "^\[" $R/ab-$v-$round.log | cut -c1-200
done; done
cd /tmp && tar czf $OUT/m.tgz r; echo "total $(( $(date +%s)-T0 )) s"
