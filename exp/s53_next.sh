# Prepared in session 53 for the next session (issue 42; not run: the device time was spent), about 4 minutes on an
# H200; carry `.whl`. Run `OUT=$OUT bash exp/s53_next.sh`.
# 1. The float8 forward's ring depth again, now that its softmax is one instruction a score shorter (call 3): 3 and 4
#    stages for the non-causal (`ov`) and causal (`pp`) defaults, at the three anchor shapes (8 x 2048 is the
#    lowest, 1.14-1.15x cuDNN bf16).
# 2. Every kernel of block-sparse attention's training step at 10% with XLA's autotuner off (session 53's listing
#    caught only the inputs' and the autotuner's kernels): its three Mosaic GPU kernels summed to 1.52 ms of the
#    1.69 ms timed; what runs in the other 0.17 ms (the backward's delta pass, dO, the loss's reduction, gaps)?
. exp/s28_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd exp && timeout 200 python3 s30_fp8_variants.py --shape 2,8192,16,128 --shape 8,2048,16,128 --repeats 10 \
    --only "ov-free bk128 s2,ov bk128 s3,ov bk128 s4,pp bk128 s2,pp bk128 s3,pp bk128 s4" 2>&1 | quiet \
    | tee "$OUT/fp8_stages.txt" | grep -v compiling | grep ms)
export XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_FLAGS="--xla_gpu_autotune_level=0"
timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum -c 120 --csv --page raw \
    python3 exp/s52_ncu_step.py sparse > "$OUT/ncu_sparse_all.csv" 2> "$OUT/ncu_sparse_all.err"
python3 - "$OUT/ncu_sparse_all.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 12 and r[0].isdigit()]
for r in rows[-40:]:  # (the second step's kernels are the last ones)
    print(f"{r[0]:>3} {float(r[-1].replace(',', '')):9.1f} us  {r[4][:110]}")
PY
