# Session 36, call 7 (nvidia-h200): the FP8 x FP8 grouped matmul forward (`fp8_lhs`, Triton) at the quantized
# forward's new default tiles and at the old ones (exp/s36_qgmm.py --fp8-lhs; call 6 cut it), then
# `ejkernel bench linear_attention --part serving` (the decode step with its new readers' kernel, the prefill with
# the WY kernel).
. exp/s28_env.sh
timeout 100 python3 exp/s36_qgmm.py --fp8-lhs --out "$OUT" 2>&1 | quiet | tail -4
timeout 150 python3 -m ejkernel.cli bench linear_attention --part serving --repeats 10 --out "$OUT" 2>&1 | quiet | tail -12
