# Session 41, call 2 (nvidia-h200): the MXFP4 grouped matmul's eight-codes decode, landed after call 1, under its GPU
# tests; the gated delta rule's decode step with both column sums taken from the loaded tile (`exp/s41_gdr_fused.py`)
# beside the landed step, and the ragged GDR GPU tests as they stand.
. exp/s28_env.sh
gpu_tests 240 tests/grouped_matmul/test_grouped_matmul_mosaic_mxfp4.py tests/test_ragged_gated_delta_rule_triton.py
timeout 150 python3 exp/s41_gdr_fused.py --out "$OUT" 2>&1 | quiet
