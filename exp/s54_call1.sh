# Session 54, call 1 (carry `.whl`; about 10 minutes). Issue 42.
# 1. The float8 forward's share spent in XLA's V transpose (`s54_fp8_parts.py`).
# 2. The dQ kernel taking `delta` itself (`s54_delta_in_dq.patch`): the training steps before and after, each in its
#    own process (`s54_bwd_ab.py`); the block-sparse and Mosaic GPU flash attention GPU tests with the patch; every
#    kernel of the block-sparse step under Nsight Compute with it and without (session 53's listing).
. exp/s28_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/device.txt"
# 0. The GDR decode step's writers in Mosaic GPU (`s54_gdr_mosaic.py`, issue 44) beside the landed Triton step.
(cd exp && timeout 150 python3 s54_gdr_mosaic.py 2>&1 | quiet | tee "$OUT/gdr_mosaic.txt" | tail -12)
ab() {  # $1: label
    (cd exp && timeout 100 python3 s54_bwd_ab.py 2>&1 | quiet | sed "s/^/$1 /" | tee -a "$OUT/bwd_ab.txt" | grep ms)
}
ncu_sparse() {  # $1: label
    XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_FLAGS="--xla_gpu_autotune_level=0" timeout 100 ncu --clock-control none \
        --metrics gpu__time_duration.sum -c 120 --csv --page raw python3 exp/s52_ncu_step.py sparse \
        > "$OUT/ncu_sparse_$1.csv" 2> "$OUT/ncu_sparse_$1.err"
    python3 - "$OUT/ncu_sparse_$1.csv" <<'PY' | tee "$OUT/ncu_sparse_$1.txt"
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 12 and r[0].isdigit()]
for r in rows:  # (the inputs' kernels, then the two steps')
    print(f"{r[0]:>3} {float(r[-1].replace(',', '')):9.1f} us  {r[4][:100]}")
PY
}
ab main
git apply exp/s54_delta_in_dq.patch && ab delta
(cd exp && timeout 90 python3 s54_fp8_parts.py --shape 8,2048,16,128 --shape 2,8192,16,128 2>&1 | quiet \
    | tee "$OUT/fp8_parts.txt" | grep ms)
OUT=$OUT TESTS="tests/sparse_attention/test_blocksparse_mosaic_gpu.py tests/flash_attention/test_gpu.py" \
    TEST_TIMEOUT=170 WORKERS=6 bash tools/gpu-suite 2>&1 | tail -8
ncu_sparse delta
git apply -R exp/s54_delta_in_dq.patch && ncu_sparse main
