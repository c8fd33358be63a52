"""`merge_attention_states`: two partial attention results over disjoint key sets joined into one."""

import dataclasses

import jax
from jaxtyping import Array, Float

from ejkernel.kernels._common.checks import require_float
from ejkernel.modules.operations._common import executor, typechecked
from ejkernel.ops import Kernel, KernelConfig
from ejkernel.registry import Backend, Platform, implementations

IMPLEMENTATIONS = implementations(
    "merge_attention_states",
    (Platform.XLA, Backend.ANY, "ejkernel.kernels._xla.merge_attention_states:merge_attention_states_xla"),
)
"""XLA only: the merge is one elementwise pass, which XLA fuses into a single kernel."""


@dataclasses.dataclass(frozen=True)
class MergeAttentionStatesConfig(KernelConfig):
    """How `merge_attention_states` runs: only the platform (`"auto"` or `"xla"`) and `backend`; no tiling.

    Raises:
        ValueError: An unknown `platform` or `backend`.
    """


class MergeAttentionStates(Kernel):
    """The executor's `Kernel` for `merge_attention_states`: op id `"merge_attention_states"`.

    Every axis is elementwise (the weights are per row and the value axis is only scaled), so a mesh may split
    any axis, as long as the outputs and log-sum-exps are split alike.
    """

    op_id = "merge_attention_states"
    config_type = MergeAttentionStatesConfig

    def axis_roles(self, args, kwargs):
        rows = tuple(f"features {i}" for i in range(args[1].ndim))
        out = (*rows, "features value")
        return {0: ("out_a", out), 1: ("lse_a", rows), 2: ("out_b", out), 3: ("lse_b", rows)}, (out, rows)

    def platform_cfgs(self, platform, inv):
        yield MergeAttentionStatesConfig(platform=platform)


@typechecked
def merge_attention_states(
    out_a: Float[Array, "*rows dim"],
    lse_a: Float[Array, "*rows"],
    out_b: Float[Array, "*rows dim"],
    lse_b: Float[Array, "*rows"],
    /,
    *,
    platform: str | None = None,
    cfg: MergeAttentionStatesConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
    in_specs=None,
    out_specs=None,
) -> tuple[Float[Array, "*rows dim"], Float[Array, "*rows"]]:
    """The attention of queries over the union of two disjoint key sets, from each set's result.

    Split-K decoding, a batch sharing one prefix (attend to the shared prefix once and to each sequence's own
    keys apart) and sequence parallelism all compute attention over parts of the keys and join the parts
    here. With `lse = log(exp(lse_a) + exp(lse_b))` (natural logarithm, as the softmax's own log-sum-exp of
    the logits after scaling), `out = out_a · exp(lse_a - lse) + out_b · exp(lse_b - lse)`, row by row. A row
    with no key on one side (lse -inf) takes the other side's result; a row with no key on either gives zeros
    and -inf, with zero gradients. Accumulates in float32. Differentiable in every argument.

    Args:
        out_a: `[*rows, dim]` float: the softmax-weighted value sum over the first key set, e.g. `[tokens,
            heads, dim]` or `[batch, seq, heads, dim]`.
        lse_a: `[*rows]` float: the log-sum-exp of the first set's logits per row (the shape of `out_a`
            without its last axis), -inf for a row with no key.
        out_b: Like `out_a`, over the second key set.
        lse_b: Like `lse_a`, over the second key set.
        platform: `"auto"` or `"xla"`; None (default): `cfg.platform`, else auto.
        cfg: A `MergeAttentionStatesConfig`; None (default): the executor's choice.
        mesh: A `jax.sharding.Mesh` to run the op on under `shard_map`; None (default): no sharding. Needs
            `in_specs` and `out_specs`.
        in_specs: A `PartitionSpec` per argument (the two outputs split alike, their log-sum-exps as their rows).
        out_specs: The pair of specs of the merged output and log-sum-exp.

    Returns:
        `(out, lse)`: `out [*rows, dim]` in `out_a`'s dtype, `lse [*rows]` float32.

    Raises:
        TypeError: A non-float argument, `out_b` unlike `out_a` in shape or a log-sum-exp not shaped as its
            output's rows (one line naming it), or a `cfg` of another class.
        ValueError: Specs that split the two sides unlike each other; a `platform` that is unknown, has no
            implementation on this device or contradicts `cfg.platform`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from ejkernel.modules import merge_attention_states
        >>> q, k, v = (jax.random.normal(jax.random.PRNGKey(i), (6, 8)) for i in range(3))
        >>> def part(k, v):  # attention of every query over some keys: (out, lse)
        ...     logits = q @ k.T
        ...     return jax.nn.softmax(logits) @ v, jax.nn.logsumexp(logits, axis=-1)
        >>> out, lse = merge_attention_states(*part(k[:2], v[:2]), *part(k[2:], v[2:]))
        >>> bool(jnp.allclose(out, part(k, v)[0], atol=1e-5)), bool(jnp.allclose(lse, part(k, v)[1], atol=1e-5))
        (True, True)
    """
    for name, x in (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        require_float(name, x)
    return executor(
        MergeAttentionStates(),
        out_a,
        lse_a,
        out_b,
        lse_b,
        platform=platform,
        cfg=cfg,
        mesh=mesh,
        in_specs=in_specs,
        out_specs=out_specs,
    )
