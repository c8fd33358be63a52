# Session 36, call 4 (nvidia-h200): the WY kernel's diagonal blocks by masked doubling against forward substitution
# (exp/s36_wy_parts.py), then the decode step's parts with XLA's conditionals inside command buffers
# (`+CONDITIONAL`): does the op's `lax.cond` (call 3: 25 us of 390) cost a host round trip?
. exp/s28_env.sh
timeout 200 python3 exp/s36_wy_parts.py 2>&1 | quiet | tail -16
XLA_FLAGS=--xla_gpu_enable_command_buffer=+CONDITIONAL,+WHILE timeout 100 python3 exp/s36_gdr_decode.py \
  --out "$OUT" 2>&1 | quiet | tail -7
