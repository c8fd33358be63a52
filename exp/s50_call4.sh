# Session 50, call 4: the ten tests of call 3's part of the GPU suite that its 380 s limit cut (exp/s50_gpu_rest.txt).
. exp/s28_env.sh
mapfile -t rest < exp/s50_gpu_rest.txt
OUT=$OUT TESTS="${rest[*]}" TEST_TIMEOUT=140 WORKERS=5 bash tools/gpu-suite 2>&1 | tail -12
