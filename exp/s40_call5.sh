# Session 40, call 5 (nvidia-h200): the MXFP4 grouped matmul as it landed in src (decoded weights as wgmma's A in
# registers, the output tile stored transposed in Mosaic GPU): its GPU tests (forward and lhs gradient against XLA,
# through the public path) and its time at the MoE shape beside bf16 and `auto`.
. exp/s28_env.sh
gpu_tests 330 tests/grouped_matmul/test_grouped_matmul_mosaic_mxfp4.py
timeout 150 python3 exp/s39_mxfp4.py --out "$OUT" --tiles 256x4,256x3 2>&1 | quiet
