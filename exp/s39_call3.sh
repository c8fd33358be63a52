# Session 39, call 3 (nvidia-h200): the MXFP4 grouped matmul with its codes assembled in PTX (two bf16x2 multiplies a
# word) beside call 2's jnp decode, the same shape and harness (exp/s39_mxfp4.py).
. exp/s28_env.sh
timeout 500 python3 exp/s39_mxfp4.py --out "$OUT" 2>&1 | quiet
