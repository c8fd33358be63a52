# Session 33, call 1 (nvidia-h200-x2): the ring's profile and the Mosaic GPU ring, then the ring and multi-GPU tests.
. exp/s28_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
python3 -c 'import jax; print("jax", jax.__version__, jax.devices())' | tee -a "$OUT/device.txt"
git log -1 --format=%H | tee -a "$OUT/device.txt"
timeout 260 python3 exp/s33_ring.py --kv-heads 16 --nocomm --out "$OUT" 2>&1 | quiet | tail -40
gpu_tests 180 tests/test_ring_attention.py tests/test_multi_gpu.py
timeout 130 python3 exp/s33_ring.py --kv-heads 4 --out "$OUT" 2>&1 | quiet | tail -20
