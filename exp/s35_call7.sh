# Session 35, call 7 (nvidia-h200): issue 44's serving rows beside flash-linear-attention (fla-core 0.6.0 from
# .whl): fla's gated delta rule decode and ragged prefill and its causal_conv1d (exp/s35_fla_serving.py), then ours
# on the same shapes (`ejkernel bench linear_attention --part serving`, `ejkernel bench causal_conv1d`).
. exp/s28_env.sh
timeout 150 python3 exp/s35_fla_serving.py --out "$OUT" 2>&1 | quiet | tail -12
timeout 200 python3 -m ejkernel.cli bench linear_attention --part serving --out "$OUT" 2>&1 | quiet | tail -14
timeout 150 python3 -m ejkernel.cli bench causal_conv1d --out "$OUT" 2>&1 | quiet | tail -16
