# Session 56, call 6 (one H200, about 2.5 minutes): the forward state pass's tiling chosen by the rows x heads a call
# has (`forward_pass_defaults`): the prefill rows of the serving bench (256 rows: 128 columns) and forward+backward at
# the training shape (32 rows: 32 columns, the tiling before) beside GLA.
. exp/s28_env.sh
(timeout 120 python3 -m ejkernel.cli bench linear_attention --part serving --repeats 20 --out "$OUT" 2>&1 | quiet | grep -e prefill -e copy)
(cd exp && timeout 100 python3 s56_training.py 2>&1 | quiet | tee "$OUT/training.txt" | tail -6)
