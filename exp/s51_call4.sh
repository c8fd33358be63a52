# Session 51, call 4: the Mamba-2 plain forward in one pass (exp/s51_ssd_pass.py) beside mamba_ssm's Triton
# `mamba_chunk_scan_combined` (the anchor harness, carried in .anchors/), then the one-pass forward's GPU test.
. exp/s28_env.sh
OUT=$OUT timeout 240 python3 .anchors/bench_ssd_triton.py > "$OUT/mamba.txt" 2>&1
grep -o '"stage": "[a-z]*"\|"fwd_ms": [0-9.]*\|"fwdbwd_ms": [0-9.]*\|"fwd_rel_err_vs_seq_f32": [0-9.e-]*' "$OUT/mamba.txt"
cd exp && PYTHONPATH=../src:/tmp/site timeout 240 python3 s51_ssd_pass.py 2>&1 | tee "$OUT/ssd_pass.txt" | grep -v Warn | tail -30
cd .. && OUT=$OUT TESTS="tests/state_space/test_ssm_triton.py::test_gpu_v2_one_pass_forward_matches_xla" \
    TEST_TIMEOUT=100 WORKERS=1 bash tools/gpu-suite 2>&1 | tail -3
