# Session 46, call 6 (nvidia-h200; the session's last 264 device seconds): issue 45's decode with the Triton paged
# core's rows shared among lanes (`_kernel.lanes_of`: a decode tile's 16 rows hold 4 copies of its 4 real ones, each
# scoring a quarter of the step's keys) against the same kernel without (`PACK_LANES = False`), each in its own
# process with its own bf16 baseline (exp/s44_kv8.py). No GPU tests: no time was left for them.
. exp/s28_env.sh
for lanes in True False; do
    echo "=== PACK_LANES = $lanes"
    timeout 70 python3 -c "import runpy, ejkernel.kernels._triton.paged_attention._kernel as k; k.PACK_LANES = $lanes; \
runpy.run_path('exp/s44_kv8.py', run_name='__main__')" 2>&1 | quiet | tail -3
done
