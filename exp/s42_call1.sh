# Session 42, call 1 (nvidia-h200): session 41's prepared forward-route harness (bf16 grouped matmul forward on Triton
# and Mosaic GPU beside `auto`, three MoE shapes), then the on-device profile of the 4-bit and bf16 Mosaic GPU
# forwards (exp/s42_profile_gmm.py), each in a process of its own.
. exp/s28_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
timeout 200 python3 exp/s41_gmm_forward_route.py --out "$OUT" 2>&1 | quiet | tail -8
timeout 300 python3 exp/s42_profile_gmm.py --out "$OUT" 2>&1 | quiet | tail -40
