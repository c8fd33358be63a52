"""Where GLA's forward+backward spends its time, ours beside flash-linear-attention's (issue 42: 5.67 ms against fla's
`chunk_gla` 6.13, target 0.8x fla). The bench's training shape (B 2, S 16384, H 16, D 128, bf16, per-channel log gates).

Ours: the device timeline of a jitted forward and of forward+backward (Triton). fla (`--fla`, a separate process:
torch and JAX each want the GPU's memory): `chunk_gla` forward+backward, its CUDA kernels per kernel from torch's
profiler.

    PYTHONPATH=src python exp/s56_gla_parts.py [--fla]
"""

from __future__ import annotations

import sys


def ours() -> None:
    import functools

    import jax
    from _kit import print_gpu_timeline

    from ejkernel.benchmarks.linear_attention import SHAPE, _inputs, _training_step
    from ejkernel.modules import gla_attention

    x = _inputs(*SHAPE)
    args = (x["q"], x["k"], x["v"], x["g"])
    call = lambda *a: gla_attention(*a, platform="triton")
    print("#### ours, GLA forward (Triton)")
    print_gpu_timeline(functools.partial(jax.jit(call), *args), steps=2, last=12)
    print("#### ours, GLA forward+backward (Triton)")
    print_gpu_timeline(_training_step(call, args), steps=2, last=40)


def fla() -> None:
    import torch
    import torch.nn.functional as F
    from _kit import print_torch_kernels
    from fla.ops.gla import chunk_gla

    batch, seq, heads, dim = 2, 16384, 16, 128
    q, k, v = (torch.randn(batch, seq, heads, dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    g = F.logsigmoid(torch.randn(batch, seq, heads, dim, device="cuda")) / 16
    for x in (q, k, v, g):
        x.requires_grad_(True)
    do = torch.randn_like(q)
    step = lambda: chunk_gla(q, k, v, g)[0].backward(do)
    print_torch_kernels(step, "fla chunk_gla forward+backward")


if __name__ == "__main__":
    fla() if "--fla" in sys.argv else ours()
