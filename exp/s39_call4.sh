# Session 39, call 4 (nvidia-h200): the MXFP4 grouped matmul with both compute warpgroups sharing each tile and its
# decoding (three decoded tiles, a barrier each), 128-row spans by 256 or 128 columns; the jnp decode once more.
. exp/s28_env.sh
timeout 500 python3 exp/s39_mxfp4.py --out "$OUT" 2>&1 | quiet
