# Session 38, call 10 (nvidia-h200): causal_conv1d's backward kernel (dense, no initial state): GPU tests, then
# forward+backward against XLA's autodiff at its tiles, and `ejkernel bench causal_conv1d`.
. exp/s28_env.sh
gpu_tests 200 tests/test_causal_conv1d_triton.py
timeout 200 python3 exp/s38_conv_bwd.py --kernel 2>&1 | quiet | tail -20
timeout 150 python3 -m ejkernel.cli bench causal_conv1d --repeats 20 --out "$OUT" 2>&1 | quiet | tail -14
