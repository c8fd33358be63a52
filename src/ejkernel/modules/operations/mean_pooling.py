"""`mean_pooling`: the average over the sequence axis, dense or over packed variable-length sequences."""

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from ejkernel.kernels._common.bounds import check_packed
from ejkernel.kernels._common.checks import require_float
from ejkernel.modules.operations._common import executor, require_rank, typechecked
from ejkernel.ops import FwdParams, Invocation, Kernel, KernelConfig
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "mean_pooling",
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.mean_pooling:mean_pooling_xla"),
    (Platform.TRITON, Backend.GPU, "ejkernel.kernels._triton.mean_pooling:mean_pooling_triton"),
)
"""XLA first: on an H200, XLA's fused reduction read at 4.0 TB/s against the Triton kernel's 3.75 (BENCHMARKS.md);
the kernel stays reachable with `platform="triton"`."""


@dataclasses.dataclass(frozen=True)
class MeanPoolingConfig(KernelConfig):
    """How `mean_pooling` runs: the platform and the Triton kernel's tiling; no field changes the result.

    Attributes:
        platform: `"auto"` (default), `"xla"` or `"triton"`.
        fwd_params: The Triton kernel's `block_k` (rows per tile, default 32), `block_d` (features per
            program, default 512), `num_warps` and `num_stages`; None (default): defaults. XLA reads none.
        bwd_params: Not read by this op.
        backend: `"any"` (default), `"gpu"`, `"tpu"` or `"cpu"`: the device kind the config is meant for; a
            call on another kind refuses it.

    Raises:
        ValueError: An unknown `platform` or `backend`.
    """


class MeanPooling(Kernel):
    """The executor's `Kernel` for `mean_pooling`: op id `"mean_pooling"`, config `MeanPoolingConfig`.

    Without a measured config, the call's `chunk_size` rows per tile; autotuning (policy `autotune`) times
    Triton tilings of 16 to 64 rows, 256 to 1024 features and 4 or 8 warps.
    """

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
    """The mean over the sequence axis: `[B, S, D] -> [B, D]`, `[B, S, h, d] -> [B, h, d]`, or per packed sequence.

    With `cu_seqlens` (cumulative lengths `[0, n1, n1 + n2, ...]`, the last at most T), `x` is `[T, D]` (or
    `[T, h, d]`) holding N sequences back to back (tokens past the last bound are ignored), and the result
    is `[N, D]`. An empty sequence gives zeros, as does an empty sequence axis. Bad bounds are a ValueError
    outside `jit` (under it too with `EJKERNEL_CHECKS=1`); otherwise, under `jit`, each bound is clamped into
    `[previous bound, T]` (the first to 0), so a sequence past T is empty (zeros) and one running past T ends
    there. Accumulates in float32; the result has `x`'s dtype.

    Args:
        x: `[batch, seq, ...features]` float, 1 to 5 feature axes; with `cu_seqlens`,
            `[tokens, ...features]`.
        cu_seqlens: `[N + 1]` integer bounds, as above; None (default): dense.
        chunk_size: Rows per tile of the Triton kernel, a positive power of two (default 32), used when no
            `cfg` is given and no cached or tuned config applies; it never changes the result.
        platform: `"auto"`, `"xla"` or `"triton"`; None (default): `cfg.platform`, else auto.
        cfg: A `MeanPoolingConfig`; None (default): the executor's choice (cache, tuning or heuristics).
        mesh: A `jax.sharding.Mesh` to run the op on under `shard_map`; None (default): no sharding. Needs
            `in_specs` and `out_specs`.
        in_specs: A `PartitionSpec` per tensor passed, or per positional slot. They may split the batch and
            the features, never the pooled axis or the packed tokens.
        out_specs: The output's spec, laid out as the inputs.

    Returns:
        `[batch, ...features]` (`[N, ...features]` with `cu_seqlens`) in `x`'s dtype.

    Raises:
        TypeError: A non-float `x`, a non-integer `cu_seqlens` or a `cfg` of another class.
        ValueError: `x` of another rank; `cu_seqlens` not 1-D with at least 2 bounds, or with bad bounds
            (rule above); `chunk_size` not a positive power of two; sharding specs that split the pooled
            axis or the tokens; a `platform` that is unknown, has no implementation on this device or
            contradicts `cfg.platform`.

    Example:
        >>> import numpy as np
        >>> from ejkernel.modules import mean_pooling
        >>> mean_pooling(np.ones((2, 5, 3), np.float32)).shape
        (2, 3)
        >>> tokens = np.ones((7, 3), np.float32)
        >>> pooled = mean_pooling(tokens, np.array([0, 3, 3, 5]))  # tokens 0-2, none, 3-4; 5-6 unused
        >>> print(pooled.shape, pooled.dtype, bool((pooled[1] == 0).all()))
        (3, 3) float32 True
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
