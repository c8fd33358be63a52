# Sourced by session 28's device scripts: the wheels the image lacks, the paths, and `gpu_tests <seconds> <files>`
# (the GPU-marked tests of the files, 4 workers of a fifth of the GPU's memory each, failures printed; the log is
# verbose, so that a run cut short still names what passed).
OUT=${OUT:-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1 EJKERNEL_PERSISTENT_CACHE_DIR=/tmp/ejk-cache
quiet() { grep -v -e Warning -e "warnings.warn" -e "^\s*$" -e "return rule" ; }
gpu_tests() {
    local limit=$1
    shift
    TEST_FAILURE_LOG=$OUT/failures.log XLA_PYTHON_CLIENT_MEM_FRACTION=0.2 timeout "$limit" \
        python3 -m pytest -v -rfE -m gpu -n 4 -p no:cacheprovider "$@" >"$OUT/gpu_tests.log" 2>&1
    grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | cut -c1-300 | tail -12
}
