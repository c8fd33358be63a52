# Session 36, call 2 (nvidia-h200): why session 35's WY kernel did not shorten the prefill (call 1: dense op 1.89 ms,
# ragged 2.03): the kernel alone at 2/4/8 warps and 1/2 stages against XLA's WY transform (exp/s36_wy_parts.py),
# then the kernel split of the ragged decode step, the ragged prefill and the dense forward+backward.
. exp/s28_env.sh
timeout 150 python3 exp/s36_wy_parts.py 2>&1 | quiet | tail -14
XLA_FLAGS=--xla_gpu_enable_command_buffer= timeout 200 python3 exp/kernel_split.py gdr_decode gdr_prefill gdr 2>&1 \
  | quiet | grep -v "^\s*0.00" | head -70
