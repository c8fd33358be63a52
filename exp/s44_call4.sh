# Session 44, call 4 (nvidia-h200): how fast one kernel reads a weight matrix's bytes at all, beside issue 45's int8
# weight-only matmuls (exp/s44_read_ceiling.py).
. exp/s28_env.sh
timeout 300 python3 exp/s44_read_ceiling.py 2>&1 | quiet | tail -9
