"""Session 44: how fast one kernel can read a weight matrix's bytes at all, beside issue 45's weight-only matmuls.

`ejkernel bench quantized_matmul` takes its bandwidth against the device copy of a bf16 [8192, 8192] matrix (128 MiB
read and written). A weight-only matmul reads 64 MiB (int8) a layer, once. Timed here in one run, four distinct
layers a call as the bench runs them (per layer): the copy; XLA's column sums of the int8 codes (`w.sum(0)` in
int32: reads the codes once, writes 32 KiB) and row sums; the column sums of a bf16 matrix (128 MiB); and
`quantized_matmul` int8, both layouts, M 16 and 64, `auto`. The read rows' bandwidth over the copy's is the most a
weight-only kernel of one read could show.

    python3 exp/s44_read_ceiling.py
"""

import functools

import jax
import jax.numpy as jnp

from ejkernel.benchmarks._harness import copy_builder, time_variants
from ejkernel.benchmarks.quantized_matmul import _layers, _packed
from ejkernel.modules import quantized_matmul

SIZE, LAYERS = 8192, 4


def main():
    key = jax.random.PRNGKey(0)
    codes = [
        jax.random.randint(k, (SIZE, SIZE), -128, 128, jnp.int32).astype(jnp.int8)
        for k in jax.random.split(key, LAYERS)
    ]
    dense = [jax.random.normal(k, (SIZE, SIZE), jnp.bfloat16) for k in jax.random.split(key, LAYERS)]
    column_sums = lambda w: jnp.sum(w, axis=0, dtype=jnp.int32 if w.dtype == jnp.int8 else jnp.float32)
    many = lambda ws: functools.partial(jax.jit(lambda ws: [column_sums(w) for w in ws]), ws)
    row_sums = jax.jit(lambda ws: [w.sum(1, dtype=jnp.int32) for w in ws])
    builders = {
        "copy (bf16 matrix, read + written)": copy_builder(dense[0].nbytes),
        "read int8 codes (XLA column sums)": functools.partial(many, codes),
        "read bf16 matrix (XLA column sums)": functools.partial(many, dense),
        "read int8 codes (XLA row sums)": lambda: functools.partial(row_sums, codes),
    }
    nbytes = {name: (2 * dense[0].nbytes if "copy" in name else LAYERS * w[0].nbytes) for name, w in (
        ("copy (bf16 matrix, read + written)", dense), ("read int8 codes (XLA column sums)", codes),
        ("read bf16 matrix (XLA column sums)", dense), ("read int8 codes (XLA row sums)", codes))}  # fmt: skip
    for transpose in (False, True):
        weights = _packed("affine", 8, transpose, SIZE, LAYERS, jax.random.fold_in(key, transpose))
        for m in (16, 64):
            x = jax.random.normal(jax.random.fold_in(key, m), (m, SIZE), jnp.bfloat16)
            op = functools.partial(quantized_matmul, transpose=transpose, bits=8, mode="affine", use_best_config=True)
            name = f"quantized_matmul int8 {'col' if transpose else 'row'} M {m}"
            builders[name] = functools.partial(_layers, op, x, weights)
            nbytes[name] = LAYERS * weights[0][0].nbytes
    timings = time_variants(builders, repeats=20, where="read ceiling")
    copy = nbytes["copy (bf16 matrix, read + written)"] / timings["copy (bf16 matrix, read + written)"]
    for name, seconds in timings.items():
        per_layer = seconds if "copy" in name else seconds / LAYERS
        bandwidth = nbytes[name] / seconds
        print(f"{name:40s} {1e3 * per_layer:.4f} ms  {bandwidth / 1e12:.2f} TB/s  {bandwidth / copy:.2f} of copy")


if __name__ == "__main__":
    main()
