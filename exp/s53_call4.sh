# Session 53, call 4 (issue 42): the float8 forward with its unmasked tiles scaling inside the exponent, landed
# (a negative logit scale negates the head's Q tile in shared memory; every second head's q descale is negative in
# the tests): the float8 GPU tests, then `ejkernel bench flash_attention --part fp8` at the anchor shapes.
. exp/s28_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PYTHONPATH=$PYTHONPATH:$PWD/tests timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/flash_attention/test_float8.py 2>&1 | quiet \
    | tee "$OUT/fp8_tests.txt" | tail -5
timeout 150 python3 -m ejkernel.cli bench flash_attention --part fp8 --repeats 10 --out "$OUT" 2>&1 | quiet \
    | tee "$OUT/bench_fp8.txt" | grep -v compiling | tail -30
