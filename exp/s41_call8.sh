# Session 41, call 8 (nvidia-h200): call 7's tile sweep crashed (an illegal address, its output flooded): each variant
# now in a process of its own, its first error line and its times kept.
. exp/s28_env.sh
for run in "mxfp4 256x3" "mxfp4 192x4" "affine 256x3" "affine 192x4"; do
    set -- $run
    echo "== $1 $2"
    timeout 80 python3 exp/s39_mxfp4.py --format $1 --tiles $2 --repeats 10 --out "$OUT" > "$OUT/run.log" 2>&1
    echo "rc $?"
    grep -m6 -E "ILLEGAL|Error|error:|x bf16|max \|out" "$OUT/run.log" | cut -c1-300
done
rm -f "$OUT/run.log"
