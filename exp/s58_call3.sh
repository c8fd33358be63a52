# Session 58, call 3 (one H200, about 5 minutes; carry [".whl"]): the dense gated delta rule's Triton path running
# chunks of at most 32 when differentiated and in its one-pass forward (`_delta.RUN_CHUNK`; a larger chunk asked for,
# EasyDeL's 64, runs as 32 there), after call 2's sweep.
# 1. GPU tests of the Triton linear-attention file.
# 2. `s58_chunks.py`, forward and forward+backward: chunk 64 asked for now times as 32 where it should.
# 3. The serving bench (prefill rows).
. exp/s28_env.sh
OUT=$OUT TESTS="tests/linear_attention/test_linear_triton.py" TEST_TIMEOUT=150 WORKERS=6 bash tools/gpu-suite 2>&1 | tail -3
(cd exp && timeout 80 python3 s58_chunks.py 2>&1 | quiet | tail -8)
(cd exp && timeout 150 python3 s58_chunks.py --train 2>&1 | quiet | tail -5)
(timeout 120 python3 -m ejkernel.cli bench linear_attention --part serving --repeats 20 --out "$OUT/bench" 2>&1 \
    | quiet | grep -e prefill -e mixed -e copy)
