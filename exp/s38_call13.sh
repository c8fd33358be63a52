# Session 38, call 13 (nvidia-h200): the review's kernel edits (conv backward's run passed once, the MLA kernel's
# first query position read only where a tile holds several queries, the GDR step's pool tile through plgpu.load /
# store): the three files' GPU tests.
. exp/s28_env.sh
gpu_tests 170 tests/test_causal_conv1d_triton.py tests/serving_attention/test_mla_mosaic_gpu.py \
    tests/linear_attention/test_ragged_gated_delta_rule_triton.py
