# Prepared in session 54 for the next session (issue 44; not run: the device time was spent), about 2 minutes on an
# H200; carry `.whl`. Run `OUT=$OUT bash exp/s54_next.sh`.
# The GDR decode step's Mosaic GPU writers with two compute warpgroups, each reducing across its warps through a
# buffer of its own (`_sums`: Mosaic GPU's reduction called by `inline_mgpu` with that buffer; session 54's call 1 ran
# two warpgroups through the kernel's one buffer, 0.838 of copy but wrong; call 2 one warpgroup, right but 0.687),
# beside the landed Triton step (0.793-0.798) and one warpgroup, with its errors against Triton.
. exp/s28_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
(cd exp && timeout 200 python3 s54_gdr_mosaic.py 2>&1 | quiet | tee "$OUT/gdr_mosaic.txt" | tail -10)
