# Session 44, call 6 (nvidia-h200): whether the Triton paged core's loads are software-pipelined on 8-bit caches as on
# bf16: each cache at 1, 2 and 3 stages (exp/s44_kv8.py --stages).
. exp/s28_env.sh
timeout 250 python3 exp/s44_kv8.py --stages 2>&1 | quiet | tail -13
