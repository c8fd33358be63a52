# Session 50, call 2: the flash attention GPU tests, now that a call whose two modes select one config runs it without
# the executor's per-mode custom VJP and head-dim-128 flash forwards go to the Mosaic GPU kernel first; the routes on
# a GPU as `explain` sees them; then short-sequence shapes off the tables (call 1 saw the Mosaic GPU pair lead
# cuDNN's training at 16 x 1024 by 1.14 / 1.28x): `auto` should run pallas forward, cuDNN forward + backward.
# Run `OUT=$OUT bash exp/s50_call2.sh` (carry `.whl`), about 9 minutes.
. exp/s28_env.sh
OUT=$OUT TESTS=tests/flash_attention TEST_TIMEOUT=330 WORKERS=6 bash tools/gpu-suite 2>&1 \
    | tail -20
python3 - <<'PY' 2>&1 | quiet | tee "$OUT/explain.txt"
import jax, jax.numpy as jnp, ejkernel
from ejkernel.modules import flash_attention, gla_attention
q, kv = jax.ShapeDtypeStruct((4, 4096, 32, 128), jnp.bfloat16), jax.ShapeDtypeStruct((4, 4096, 8, 128), jnp.bfloat16)
print(ejkernel.explain("flash_attention", q, kv, kv, causal=True))
loss = lambda q, k, v: flash_attention(q, k, v, causal=True).astype(jnp.float32).sum()
print(ejkernel.explain(jax.grad(loss), q, kv, kv))
g = jax.ShapeDtypeStruct((2, 4096, 16, 128), jnp.bfloat16)
gla_loss = lambda q, k, v, g: gla_attention(q, k, v, g)[0].astype(jnp.float32).sum()
print(ejkernel.explain(jax.grad(gla_loss), g, g, g, g))
PY
OUT=$OUT SKIP_TESTS=1 BENCH_TIMEOUT=170 bash tools/gpu-suite "flash_attention --shape 32,512,32,128,8 \
    --shape 8,1024,16,128 --shape 16,1024,32,128,8 --shape 4,2048,32,128,8 \
    --only ejkernel-auto,ejkernel-pallas,jax-cudnn --repeats 10" > "$OUT/short.txt" 2>&1
tail -20 "$OUT/short.txt"
