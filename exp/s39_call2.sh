# Session 39, call 2 (nvidia-h200): issue 45's MXFP4 grouped matmul as a Mosaic GPU kernel (E2M1 codes decoded into
# wgmma's B tile in shared memory, exp/s39_mxfp4.py): accuracy against XLA's dequantize-then-multiply and times beside
# our bf16 grouped matmul and today's MXFP4 path (Triton) at the MoE shape, four tilings.
. exp/s28_env.sh
timeout 500 python3 exp/s39_mxfp4.py --out "$OUT" 2>&1 | quiet
