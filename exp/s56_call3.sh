# Session 56, call 3 (one H200, carry `.whl` with fla-core 0.6.0; about 7 minutes). The gated delta rule's prefill
# forward after u and w leave the WY kernel in the inputs' dtype and the undifferentiated forward makes its scores in
# the output kernel: the GPU tests of the Triton linear-attention and ragged GDR files and the Mosaic GPU ragged file,
# the serving bench, the kernels' timeline, the state pass's tiling sweep (`s56_state_pass.py`), fla's rows.
. exp/s28_env.sh
OUT=$OUT TESTS="tests/linear_attention/test_linear_triton.py tests/linear_attention/test_ragged_gated_delta_rule_triton.py tests/linear_attention/test_ragged_gated_delta_rule_mosaic_gpu.py" \
    TEST_TIMEOUT=200 WORKERS=6 bash tools/gpu-suite "linear_attention --part serving --repeats 20" 2>&1 | tail -24
(cd exp && timeout 100 python3 s56_gdr_prefill_parts.py 2>&1 | quiet | tee "$OUT/gdr_prefill_parts.txt" | grep -v "^ *[0-9.]* *[0-9.]* us .*\(fusion\|convert\|transpose\|case\)")
(cd exp && timeout 90 python3 s35_fla_serving.py --out "$OUT" 2>&1 | quiet | tail -6)
(cd exp && timeout 240 python3 s56_state_pass.py 2>&1 | quiet | tee "$OUT/state_pass.txt" | tail -60)
