# Session 47, call 2 (nvidia-h200): session 46's prepared windowed flash attention tuning (exp/s46_next_window.sh):
# every implementation beside cuDNN with a causal 4096-token window, autotuned; the winners land in $OUT.
bash exp/s46_next_window.sh 2>&1 | tee "$OUT/window.txt"
