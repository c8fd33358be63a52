# Session 36, call 9 (nvidia-h200): the WY pullback kernel at its new default, 4 warps, beside 2 (exp/s36_gdr_train.py;
# call 8: 6.38 ms at 4, 6.81 at 8, GLA 5.57), then `ejkernel bench linear_attention --part training` for the record.
. exp/s28_env.sh
timeout 90 python3 exp/s36_gdr_train.py 2>&1 | quiet | tail -4
timeout 170 python3 -m ejkernel.cli bench linear_attention --part training --repeats 10 --out "$OUT" 2>&1 | quiet | tail -12
