# Session 34, call 2 (nvidia-h200-x2): why 4 KV heads' forward+backward went from 1.83x (ff12ef9) to 1.60x (call 1):
# the ring of ff12ef9, the current one, and the current one with every step's pairs in plain order; then the FP8
# grouped-matmul MoE-shape tests, given time to compile.
. exp/s28_env.sh
ring() { timeout "$1" python3 exp/s33_ring.py --out "$OUT" --platforms cuda --flash "" --kv-heads 4 "${@:2}" 2>&1 | quiet ; }
variant() { rm -rf "/tmp/$1" && mkdir -p "/tmp/$1" && cp -r src "/tmp/$1/"; }
variant before && git show ff12ef9:src/ejkernel/kernels/_common/ring.py > /tmp/before/src/ejkernel/kernels/_common/ring.py
variant plain && python3 - <<'PY'
import pathlib
p = pathlib.Path("/tmp/plain/src/ejkernel/kernels/_common/ring.py")
s = p.read_text()
old = "    if step == steps - 1 and step > 0:\n        return sorted(pairs, key=lambda pair: (pair[1], -pair[0]))\n"
assert old in s
p.write_text(s.replace(old, ""))
PY
echo "#### ff12ef9"; PYTHONPATH=/tmp/before/src:/tmp/site ring 100 --tag _ff12
echo "#### current"; ring 100 --tag _now
echo "#### current, plain pair order"; PYTHONPATH=/tmp/plain/src:/tmp/site ring 100 --tag _plain
XLA_PYTHON_CLIENT_MEM_FRACTION=0.4 timeout 240 python3 -m pytest -v -rfE -m gpu -n 2 -p no:cacheprovider \
  tests/grouped_matmul/test_grouped_matmul_mosaic_fp8.py -k moe_shape --durations=10 > "$OUT/fp8.log" 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|s call" "$OUT/fp8.log" | cut -c1-300 | tail -16
