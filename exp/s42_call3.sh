# Session 42, call 3 (nvidia-h200): is the MXFP4 kernel starved by the memory system? Its profile and time with 132
# and 66 persistent CTAs (half the SMs: half the demand on L2 and HBM), and with 4 stages, beside bf16.
. exp/s28_env.sh
timeout 300 python3 exp/s42_profile_gmm.py --out "$OUT" --events 500 --formats mxfp4 --bf16 no --repeats 10 \
    --tilings 256x3,256x3x66,256x4,256x4x66 2>&1 | quiet | tail -16
