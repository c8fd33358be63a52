# Session 38, call 2 (nvidia-h200): the ragged GDR decode's two kernels with the pool's tile evicted first
# (loads, stores, both), and the causal_conv1d window forward with SiLU through the approximate tanh.
. exp/s28_env.sh
timeout 200 python3 exp/s38_gdr_decode.py --out "$OUT" 2>&1 | quiet | tail -8
timeout 230 python3 exp/s38_conv.py --round 2 --out "$OUT" 2>&1 | quiet | tail -30
