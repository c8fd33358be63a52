"""Twenty-eighth session: the Triton paged core on the serving bench's two mixed cases, by tiling.

`default` runs two passes (short sequences apart); a config that fixes `block_q` runs one pass. Prints ms per
variant; run on the GPU: `python3 exp/s28_mixed_sweep.py`.
"""

import functools

import jax

from ejkernel.benchmarks._harness import time_variants
from ejkernel.benchmarks.serving_attention import DIM, HEADS, KV_HEADS, MIXED, PAGE, make_problem
from ejkernel.modules.operations.page_attention import PagedAttentionConfig
from ejkernel.ops import FwdParams
from ejkernel.registry import kernel_registry

fn = kernel_registry.get("unified_attention", "triton", "gpu")
VARIANTS = {
    "default (two passes)": None,
    "one pass bq32": dict(block_q=32),
    "one pass bq16": dict(block_q=16),
    "one pass bq32 bk128 w8": dict(block_q=32, block_k=128, num_warps=8),
    "two passes bk128 w8": dict(block_k=128, num_warps=8),
    "two passes bk64 w8": dict(block_k=64, num_warps=8),
    "two passes bk64 w8 s3": dict(block_k=64, num_warps=8, num_stages=3),
    "two passes bk32 w4 s3": dict(block_k=32, num_warps=4, num_stages=3),
    "two passes bk128 w8 s3": dict(block_k=128, num_warps=8, num_stages=3),
}
for n_decode, decode_ctx, n_prefill, chunk, prefill_ctx in MIXED:
    q_lens = [1] * n_decode + [chunk] * n_prefill
    kv_lens = [decode_ctx] * n_decode + [prefill_ctx + chunk] * n_prefill
    args, _ = make_problem("unified_attention", q_lens, kv_lens, heads=HEADS, kv_heads=KV_HEADS, dim=DIM, page=PAGE)

    def build(params, args=args):
        cfg = None if params is None else PagedAttentionConfig(fwd_params=FwdParams(**params))
        return functools.partial(jax.jit(lambda *a: fn(*a, cfg=cfg)), *args)

    t = time_variants({k: functools.partial(build, v) for k, v in VARIANTS.items()}, repeats=10, where="")
    print(f"mixed {n_decode}x1@{decode_ctx} + {n_prefill}x{chunk}@{prefill_ctx}")
    for name, seconds in t.items():
        print(f"  {name:28s} {1e3 * seconds:.3f} ms")
