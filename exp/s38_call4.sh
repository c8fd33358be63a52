# Session 38, call 4 (nvidia-h200): the Triton paged core loading its per-token-head scales before the first dot
# (GPU tests, then bf16 / e4m3 / int8 v3 decode), and MLA decode at 16, 32 and 128 heads (Triton; Mosaic GPU with
# its queries padded to 64 heads below 64).
. exp/s28_env.sh
gpu_tests 200 tests/serving_attention/test_paged_kv_scales.py tests/serving_attention/test_paged_triton.py
timeout 150 python3 exp/s29_kvscales.py 2>&1 | quiet | tail -4
timeout 240 python3 exp/s38_mla.py 2>&1 | quiet | tail -8
