# Prepared in session 50, not run (no device time left): the ten tests of session 50 call 3's part of the GPU suite
# that its 380 s limit cut (exp/s50_gpu_rest.txt; 44 passed before, none failed). Run `OUT=$OUT bash
# exp/s50_next_gpu_rest.sh` (carry `.whl`), about 2 minutes.
. exp/s28_env.sh
mapfile -t rest < exp/s50_gpu_rest.txt
OUT=$OUT TESTS="${rest[*]}" TEST_TIMEOUT=140 WORKERS=5 bash tools/gpu-suite 2>&1 | tail -12
