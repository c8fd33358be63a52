# Prepared in session 58 for a later call, on branch `s58-state-unroll` (one H200, about 5 minutes; carry [".whl"]):
# GPU tests of the Triton linear-attention file, then the state passes at 1, 2 and 4 chunks a loop step
# (`s58_unroll.py`). Take a default above 1 only where it wins at every row.
. exp/s28_env.sh
OUT=$OUT TESTS="tests/linear_attention/test_linear_triton.py" TEST_TIMEOUT=150 WORKERS=6 bash tools/gpu-suite 2>&1 | tail -3
(cd exp && timeout 300 python3 s58_unroll.py 2>&1 | quiet | tail -6)
