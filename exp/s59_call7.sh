# Session 59, call 7 (one H200, about 5 minutes; carry [".whl", ".anchors"]): GLA's and Mamba-2's state passes at
# four and eight chunks a loop step (`s59_unroll8.py`), then fla's `chunk_gla` forward+backward (the anchor harness;
# call 6 gave it 150 s and it printed nothing: its Triton autotuning), beside our GLA timed in the same call.
. exp/s28_env.sh
(cd exp && timeout 150 python3 s59_unroll8.py 2>&1 | quiet | tail -4)
OUT=$OUT timeout $((360 - SECONDS)) python3 .anchors/fla_gla.py > "$OUT/fla_gla.txt" 2>&1
tail -2 "$OUT/fla_gla.txt"
