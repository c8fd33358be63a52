# Prepared in session 54 on branch `s54-gdr-mosaic` for the next session (issue 44; not run: the device time was
# spent). About 5 minutes on an H200; carry `.whl`; run from a checkout of the branch: `OUT=$OUT bash exp/s54_branch_call.sh`.
# The packaged Mosaic GPU decode step (own readers' pass and XLA's modes, instead of the prototype's Triton readers'
# kernel): its GPU tests and the Triton ones beside them, then the serving bench, whose `auto` decode row now routes
# to it (the prototype measured 0.840 of copy against Triton's 0.798).
. exp/s28_env.sh
OUT=$OUT TESTS="tests/linear_attention/test_ragged_gated_delta_rule_mosaic_gpu.py tests/linear_attention/test_ragged_gated_delta_rule_triton.py" \
    TEST_TIMEOUT=200 WORKERS=4 bash tools/gpu-suite "linear_attention --part serving --repeats 20" 2>&1 | tail -30
