"""`mean_pooling`: the average over the sequence axis, dense or over packed variable-length sequences."""

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.bounds import check_packed
from ejkernel.modules.operations._common import executor, require_float, require_rank, typechecked
from ejkernel.ops import FwdParams, Invocation, Kernel, KernelConfig


@dataclasses.dataclass(frozen=True)
class MeanPoolingConfig(KernelConfig):
    """`fwd_params.block_k`: rows per tile; `block_d`: features per program; `num_warps`, `num_stages`."""


class MeanPooling(Kernel):
    op_id = "mean_pooling"
    config_type = MeanPoolingConfig

    def axis_roles(self, args, kwargs):
        """Batch and features split freely; the pooled axis (or the packed tokens) never."""
        x, packed = args[0], args[1] is not None
        features = tuple(f"features {i}" for i in range(x.ndim - (1 if packed else 2)))  # each split alone
        inputs = {0: ("x", ("tokens", *features) if packed else ("batch", "seq", *features))}
        inputs[1] = ("cu_seqlens", ("tokens",))
        return inputs, (None, *features) if packed else ("batch", *features)

    def call_impl(self, impl, args, kwargs, cfg):
        return impl.fn(*args, cfg=cfg)  # chunk_size only seeds the heuristic tiling

    def heuristic_cfg(self, inv: Invocation) -> MeanPoolingConfig:
        # Through the executor directly, `chunk_size` may be absent: the implementation's own tiling then.
        return MeanPoolingConfig(platform=inv.platform, fwd_params=FwdParams(block_k=inv.kwargs.get("chunk_size")))

    def platform_cfgs(self, platform: str, inv: Invocation):
        if platform != "triton":
            yield MeanPoolingConfig(platform=platform)
            return
        for block_d in (256, 512, 1024):
            for block_k in (16, 32, 64):
                for warps in (4, 8):
                    yield MeanPoolingConfig(
                        platform=platform, fwd_params=FwdParams(block_k=block_k, block_d=block_d, num_warps=warps)
                    )


@typechecked
def mean_pooling(
    x: Float[Array, "..."],
    cu_seqlens: Int[Array, " n_plus_1"] | None = None,
    /,
    *,
    chunk_size: int = 32,
    platform: str | None = None,
    cfg: MeanPoolingConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs=None,
    out_specs=None,
) -> Float[Array, "..."]:
    """Mean over axis 1: `[B, S, D] -> [B, D]`, `[B, S, h, d] -> [B, h, d]`.

    With `cu_seqlens [N+1]` (cumulative lengths `[0, n1, n1+n2, ...]`, the last at most T), `x` is
    `[T, D]` (or `[T, h, d]`) holding N sequences back to back (tokens past the last bound are ignored),
    and the result is `[N, D]`. An empty sequence gives zeros. Bad bounds are a ValueError outside `jit`;
    under `jit` each bound is clamped into `[previous bound, T]` (the first to 0), so a sequence past T
    is empty (zeros) and one running past T ends there.
    Accumulates in float32; the result has `x`'s dtype.
    """
    require_float("x", x)
    if cu_seqlens is None:
        require_rank("x", x, range(3, 8), "[batch, seq, ...features]")
        if x.shape[1] == 0:
            return jnp.zeros(x.shape[:1] + x.shape[2:], x.dtype)
    else:
        require_rank("x", x, range(2, 7), "[tokens, ...features] when cu_seqlens is given")
        check_packed("cu_seqlens", cu_seqlens, x.shape[0])
    if not isinstance(chunk_size, int) or chunk_size <= 0 or chunk_size & (chunk_size - 1):
        raise ValueError(f"chunk_size must be a positive power of two, got {chunk_size!r}")
    return executor(
        MeanPooling(),
        x,
        cu_seqlens,
        chunk_size=chunk_size,
        platform=platform,
        cfg=cfg,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
    )
