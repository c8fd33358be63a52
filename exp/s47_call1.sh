# Session 47, call 1 (nvidia-h200): session 46's prepared A/Bs, timing only (GPU tests of what wins come in a later
# call): FFMA against FMUL + FADD under Nsight Compute (exp/s46_next_ncu_fma.sh), the weight-only matmul with its
# affine decode as one fma (exp/s46_qmm_fma.patch), and the GDR decode step with qᵀh, kᵀh as one dot
# (exp/s46_gdr_dot.patch). Each prints into $OUT.
. exp/s28_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
bash exp/s46_next_ncu_fma.sh 2>&1 | tee "$OUT/ncu_fma.txt"
for version in before after; do
    [ $version = after ] && patch -p1 < exp/s46_qmm_fma.patch > /dev/null
    echo "=== qmm $version"
    timeout 150 python3 exp/s46_qmm_tiles.py 2>&1 | quiet | grep -E "===|heuristic"
done 2>&1 | tee "$OUT/qmm_fma.txt"
patch -R -p1 < exp/s46_qmm_fma.patch > /dev/null
for version in main dot; do
    [ $version = dot ] && patch -p1 < exp/s46_gdr_dot.patch > /dev/null
    echo "=== gdr $version"
    timeout 120 python3 exp/s38_gdr_decode.py --out /tmp/$version 2>&1 | quiet | tail -6
done 2>&1 | tee "$OUT/gdr_dot.txt"
