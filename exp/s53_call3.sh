# Session 53, call 3 (issue 42). 1: the float8 forward's unmasked tiles scaling inside the exponent (`fs`: the row
# max taken on the raw scores, which a positive scale commutes with, and exp2(s·c - m) one FMA a score, as the bf16
# forward does; the float8 kernel multiplied every score by the logit scale first, then subtracted the max: one
# FMUL a score more). 2: every kernel of block-sparse attention's training step at 10% under Nsight Compute,
# durations only: the three Mosaic GPU kernels summed to 1.52 ms in call 1 against 1.695 ms timed, so ~0.17 ms
# runs elsewhere (the backward's delta pass, dO, the loss).
. exp/s28_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd exp && timeout 300 python3 s30_fp8_variants.py --shape 2,8192,16,128 --shape 1,16384,16,128 --repeats 10 \
    --only "ov-free bk128 s2,ov-free bk128 s2 fs,ov-free bk128 s2 e16 fs,ov-turns bk128 s2 fs,pp bk128 s2,pp bk128 s2 fs,pp bk128 s2 e16 fs" 2>&1 | quiet \
    | tee "$OUT/fp8_scale_in_exponent.txt" | grep -v compiling | grep ms)
export XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum -c 60 --csv --page raw \
    python3 exp/s52_ncu_step.py sparse > "$OUT/ncu_sparse_all.csv" 2> "$OUT/ncu_sparse_all.err"
python3 - "$OUT/ncu_sparse_all.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 12 and r[0].isdigit()]
for r in rows:  # (the inputs' kernels, then the step twice)
    print(f"{r[0]:>3} {float(r[-1].replace(',', '')):9.1f} us  {r[4][:110]}")
PY
