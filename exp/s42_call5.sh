# Session 42, call 5 (nvidia-h200): what the MXFP4 kernel's decode costs, part by part (exp/s42_decode_cost.py;
# timing only, the variants' outputs are wrong). Call 4's ISSUE_AHEAD was reverted: its outputs were NaN.
. exp/s28_env.sh
timeout 240 python3 exp/s42_decode_cost.py --out "$OUT" --repeats 20 2>&1 | quiet | grep -v "max |out" | tail -6
