# Session 38, call 12 (nvidia-h200): causal_conv1d's backward kernel for packed calls too: GPU tests, then packed
# forward+backward against XLA's autodiff (runs inside sequences, runs across bounds).
. exp/s28_env.sh
gpu_tests 200 tests/test_causal_conv1d_triton.py
timeout 200 python3 exp/s38_conv_bwd.py --packed 2>&1 | quiet | tail -8
