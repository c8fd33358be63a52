"""Session 56: where the gated delta rule's prefill forward spends its time, ours beside flash-linear-attention's
(fla 0.6.0 ran 8 x 2048 tokens, H 32, D 128 in 1.05 ms against our 1.67-1.78 in session 56's first call).

Ours: the device timeline of `gated_delta_rule(..., return_state=True)` (Triton, chunk 32 and 64) on the serving
bench's prefill tokens, then `ragged_gated_delta_rule`'s
(Triton) on them as 8 requests. fla (`--fla`, a separate process: torch and JAX each want the GPU's memory): the CUDA
kernels of `chunk_gated_delta_rule` with `cu_seqlens`, per kernel, from torch's profiler.

    PYTHONPATH=src python exp/s56_gdr_prefill_parts.py [--fla] [--chunk64]   # --chunk64: the ragged op at 64 too
"""

from __future__ import annotations

import sys


def ours() -> None:
    import functools

    import jax
    from _kit import print_gpu_timeline

    from ejkernel.benchmarks.linear_attention import PREFILL, _inputs, _ragged, _serving_loop
    from ejkernel.modules import GatedDeltaRuleConfig, gated_delta_rule

    requests, length, heads, dim = PREFILL
    d = _inputs(requests, length, heads, dim)
    dense = tuple(d[n] for n in ("q", "k", "v", "beta", "decay"))
    pool = jax.random.normal(jax.random.PRNGKey(3), (requests, heads, dim, dim), jax.numpy.float32)
    for chunk in (32, 64):
        cfg = GatedDeltaRuleConfig(chunk_size=chunk, platform="triton")
        run = jax.jit(functools.partial(gated_delta_rule, return_state=True, cfg=cfg))
        print(f"#### ours, Triton, chunk {chunk}")
        print_gpu_timeline(functools.partial(run, *dense, None, pool), steps=2, last=16)
    flat = tuple(x.reshape(requests * length, *x.shape[2:]) for x in dense)
    bounds = jax.numpy.arange(0, requests * length + 1, length, dtype=jax.numpy.int32)
    for chunk in (None, 64) if "--chunk64" in sys.argv else (None,):
        print(f"#### ours, ragged_gated_delta_rule, Triton, request bounds, chunk {chunk or 'own'}")
        ragged = functools.partial(_ragged("triton"), chunk_size=chunk)
        call = _serving_loop(ragged, (*flat, bounds, bounds[:-1] // length), pool)
        print_gpu_timeline(call, steps=2, last=24)


def fla() -> None:
    import torch
    import torch.nn.functional as F
    from _kit import print_torch_kernels
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    requests, length, heads, dim = 8, 2048, 32, 128
    x = lambda *shape: torch.randn(*shape, device="cuda")
    q, k = (F.normalize(x(1, requests * length, heads, dim), dim=-1).to(torch.bfloat16) for _ in range(2))
    v = x(1, requests * length, heads, dim).to(torch.bfloat16)
    g = -0.05 * F.softplus(x(1, requests * length, heads))
    beta = torch.sigmoid(x(1, requests * length, heads))
    cu = torch.arange(0, requests * length + 1, length, device="cuda", dtype=torch.long)
    states = torch.randn(requests, heads, dim, dim, device="cuda")
    call = lambda: chunk_gated_delta_rule(
        q, k, v, g=g, beta=beta, initial_state=states, output_final_state=True, cu_seqlens=cu
    )
    print_torch_kernels(call, "fla chunk_gated_delta_rule")


if __name__ == "__main__":
    fla() if "--fla" in sys.argv else ours()
