# Session 46, call 7 (nvidia-h200): call 6's lanes at most 2 (sub-blocks of 64 keys for an 8-bit cache, 32 for bf16),
# each in its own process with its own bf16 baseline (exp/s44_kv8.py).
. exp/s28_env.sh
echo "=== at most 2 lanes"
timeout 70 python3 -c "import runpy, ejkernel.kernels._triton.paged_attention._interface as i; f = i.lanes_of; \
i.lanes_of = lambda *a: min(2, f(*a)); runpy.run_path('exp/s44_kv8.py', run_name='__main__')" 2>&1 | quiet | tail -3
