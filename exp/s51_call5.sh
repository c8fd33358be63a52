# Session 51, call 5: Mamba-2 beside mamba_ssm's Triton kernels again (call 4 timed them at 1.344 / 5.660 ms, the
# slowest on record: 0.878 / 4.456 on 2026-11-25, 1.141 / 3.642 on 2026-11-28): ours, mamba's harness twice (each
# process autotunes afresh), ours again.
. exp/s28_env.sh
ours() { (cd exp && PYTHONPATH=../src:/tmp/site timeout 150 python3 s51_ssd_time.py 2>&1 | grep "ms$"); }
mamba() {
    OUT=$OUT timeout 150 python3 .anchors/bench_ssd_triton.py > "$OUT/mamba_$1.txt" 2>&1
    grep -o '"fwd_ms": [0-9.]*\|"fwdbwd_ms": [0-9.]*' "$OUT/mamba_$1.txt" | sort -u
}
ours; mamba 1; mamba 2; ours
