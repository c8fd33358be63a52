# Session 59, call 6 (one H200, about 7 minutes; carry [".whl", ".anchors"], `.anchors` a copy of ../shared/anchors):
# GPU tests of what landed (GLA's passes at unroll 4, the delta rule's one pass from 64 rows and chunk 64, the
# ragged prefill's affine addresses), the landed times (`s59_landed.py`, `s57_capped.py`), then the anchors in the
# same call: fla's `chunk_gla` and mamba_ssm's `mamba_chunk_scan_combined`.
. exp/s28_env.sh
OUT=$OUT TESTS="tests/linear_attention/test_linear_triton.py tests/state_space/test_ssm_triton.py tests/linear_attention/test_ragged_gated_delta_rule_triton.py" \
    TEST_TIMEOUT=200 WORKERS=6 bash tools/gpu-suite 2>&1 | tail -4
(cd exp && timeout 200 python3 s59_landed.py 2>&1 | quiet | tail -12)
(cd exp && timeout 60 python3 s57_capped.py 2>&1 | quiet | tail -2)
OUT=$OUT timeout 150 python3 .anchors/fla_gla.py 2>&1 | tail -1
OUT=$OUT timeout 150 python3 .anchors/bench_ssd_triton.py > "$OUT/mamba.txt" 2>&1
grep -o '"fwd_ms": [0-9.]*\|"fwdbwd_ms": [0-9.]*' "$OUT/mamba.txt"
