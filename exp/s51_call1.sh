# Session 51, call 1: the ten GPU tests session 50's call 3 did not reach, then the flash attention routes the
# heuristic does not cover yet (head dim 64; causal training at 4096-8192 keys). Both scripts were prepared in session 50.
. exp/s28_env.sh
OUT=$OUT bash exp/s50_next_gpu_rest.sh 2>&1 | tee "$OUT/rest.txt" | tail -14
OUT=$OUT bash exp/s50_next_routes.sh
