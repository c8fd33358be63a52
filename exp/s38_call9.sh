# Session 38, call 9 (nvidia-h200): causal_conv1d's dense backward, XLA's autodiff against a written-out formula.
. exp/s28_env.sh
timeout 200 python3 exp/s38_conv_bwd.py 2>&1 | quiet | tail -12
