# Session 37, call 2 (nvidia-h200-x2): forward+backward only (call 1's ran out of time after the forward): auto
# (cuDNN steps), the Mosaic GPU forward + cuDNN backward merging in the kernel and in XLA, beside one GPU's cuDNN.
. exp/s28_env.sh
ring() { timeout "$1" python3 exp/s33_ring.py --out "$OUT" --modes fwd+bwd "${@:2}" 2>&1 | quiet ; }
echo "#### kv heads 16"; ring 270 --platforms auto,mixed,mixed-merged --flash cuda --tag _s37c2
echo "#### kv heads 4"; ring 270 --platforms auto,mixed,mixed-merged --flash cuda --kv-heads 4 --tag _s37c2
