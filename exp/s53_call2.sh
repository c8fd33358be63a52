# Session 53, call 2 (issue 42): the float8 forward's row sums on the tensor cores, P·e₀ into a sums tile zeroed every
# key tile and added to a float32 vector (session 48's version accumulated across all tiles in the wgmma's own
# accumulator, whose e4m3 adds keep ~13 bits: at 1024 keys the sums came out 0.75% low in session 52's diagnosis,
# at 8192 keys 15-32% wrong). First the float8 GPU tests (the row-sums variants among them), then the A/B timing.
. exp/s28_env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
PYTHONPATH=$PYTHONPATH:$PWD/tests timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/flash_attention/test_float8.py 2>&1 | quiet \
    | tee "$OUT/fp8_tests.txt" | tail -5
(cd exp && timeout 300 python3 s30_fp8_variants.py --shape 2,8192,16,128 --shape 1,16384,16,128 --repeats 10 \
    --only "ov-free bk128 s2,ov-free bk128 s2 tc,ov-free bk128 s2 e16 tc,ov-free bk128 s2 e32 tc,pp bk128 s2,pp bk128 s2 e16,pp bk128 s2 tc,pp bk128 s2 e16 tc,pp bk128 s2 e32 tc" 2>&1 | quiet \
    | tee "$OUT/fp8_row_sums.txt" | grep -v compiling | grep ms)
