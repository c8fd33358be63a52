"""Linear attention on the Triton platform: the family's entries (`_common.linear_attention.entries`) with the
heavy parts in GPU kernels.

The gated recurrence (GLA, lightning, recurrent) runs whole in the chunk kernels of `_gla` (inputs in
their token layout and dtype, forward and backward). So does the delta rule of one sequence per row
(`_delta`: GLA's kernels of a gate per head around state passes of its own, the WY transform in XLA);
with restarts (segment ids) its chunk parts and pullbacks stay in XLA, and its chunk-to-chunk state
passes run as one kernel per direction (`_state_passes.exit_states`, `_state_passes.entry_grads`). A one-token call
(decoding) is one fused step kernel.
Calls it does not serve (the recurrent form, head dims that are not powers of two in [16, 256]) raise
NotImplementedError before any kernel is traced.
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp

from ejkernel.kernels._common.linear_attention import entries
from ejkernel.kernels._common.linear_attention.driver import Engine
from ejkernel.kernels._common.linear_attention.scan import ScanPasses
from ejkernel.kernels._triton._helpers import resolve_interpret
from ejkernel.kernels._triton.linear_attention._delta import delta_chunked
from ejkernel.kernels._triton.linear_attention._gla import TritonGlaTiling, gla_chunked
from ejkernel.kernels._triton.linear_attention._state_passes import (
    TritonStatePassTiling,
    entry_grads,
    exit_states,
    fused_step,
)

WHO = "triton linear attention"
MIN_CHUNK = 16  # smallest matmul edge Triton takes


@dataclasses.dataclass(frozen=True)
class TritonPasses(ScanPasses):
    tiling: TritonStatePassTiling

    def exit_states(self, p, init, starts):
        return exit_states(p, init, starts, self.tiling)

    def entry_grads(self, p, dh_own, d_exit, starts):
        return entry_grads(p, dh_own, d_exit, starts, self.tiling)


@dataclasses.dataclass(frozen=True)
class TritonEngine(Engine):
    tiling: TritonStatePassTiling
    gla: TritonGlaTiling = dataclasses.field(default_factory=TritonGlaTiling)
    min_chunk = MIN_CHUNK
    # GLA (gates per key channel) runs chunks of at most 32, its fastest: H200, B=2 S=16384 H=16 D=128 bf16, ms at
    # chunks 16, 32, 64 (`exp/s58_gla_chunks.py`, state passes at one chunk a step): forward 2.38, 1.75, 1.66,
    # forward+backward 6.43, 5.68, 9.14; with four chunks a step (`exp/s59_landed.py`) forward 1.58 at 32, 1.70 at 64.
    gated_chunk = 32
    key_gated_chunk_cap = 32
    # The gated delta rule's chunk where the config sets none: 64, where a differentiated call and the one-pass forward
    # run 32 regardless (`_delta.RUN_CHUNK`). H200, bf16, D 128, ms at 32 and 64 (`exp/s58_chunks.py`): forward
    # without segments 1.72 and 1.55 (B 2 x 16384, H 16); with 4 segments a row (chunk parts in XLA, not capped)
    # forward 5.25 and 4.51, forward+backward 16.2 and 13.9 there, 3.17 and 2.68 at B 1 x 4096.
    delta_chunk = 64

    @property
    def passes(self):
        return TritonPasses(self.tiling)

    def chunked(self, xs: dict, init, starts, *, delta: bool, dtype):
        engine = dataclasses.replace(self, tiling=dataclasses.replace(self.tiling, precise=dtype == jnp.float32))
        return Engine.chunked(engine, xs, init, starts, delta=delta, dtype=dtype)

    def _gla_tiling(self, dtype) -> TritonGlaTiling:
        """The GLA kernels' tiling for inputs of `dtype` (float32: full-precision matmuls)."""
        return dataclasses.replace(self.gla, interpret=self.tiling.interpret, precise=jnp.dtype(dtype) == jnp.float32)

    def gated(self, xs: dict, init, layout, *, scale: float):
        """The gated recurrence in the `_gla` kernels: a gate per key channel `[B, S, H, Dk]` (per-head
        gates added in), or one per head `[B, S, H, 1]` (zeros without gates). H = the most heads of q and
        v; k and v shared by groups of query heads (grouped-query), or q and k by groups of value heads (SSD)."""
        q, k, v = xs["q"], xs["k"], xs["v"]
        heads = max(q.shape[2], v.shape[2])
        if any(heads % x.shape[2] for x in (q, k, v)):
            shapes = ", ".join(f"{n} {x.shape[2]}" for n, x in (("q", q), ("k", k), ("v", v)))
            raise ValueError(f"{WHO}: the heads of q, k and v must divide the most of them, got {shapes}")
        if "a_key" in xs:
            gate = xs["a_key"] if "a_head" not in xs else xs["a_key"] + xs["a_head"][..., None]
        else:
            gate = xs.get("a_head", jnp.zeros((*q.shape[:2], heads), jnp.float32))[..., None]
        empty = jnp.zeros(init.shape[:1], bool) if layout.empty is None else layout.empty
        out, final = gla_chunked(
            self._gla_tiling(v.dtype),
            scale,
            layout.tokens is not None,
            *(layout.pad(x) for x in (q, k, v, gate)),
            init,
            layout.starts,
            layout.ends(),
            layout.owners(),
            empty,
        )
        return layout.unpad(out), final

    def delta(self, xs: dict, init, layout, *, scale: float, l2norm: bool):
        """The chunked delta rule in `_delta`'s kernels: q, k, v `[B, S, H, ·]`, beta and the log gates per
        head `a_head` (zeros without) `[B, S, H]`; one sequence per row. q and k are used in v's dtype (in
        float32 their matmuls would take full-precision FMAs); with `l2norm` they come raw and `delta_chunked`
        normalises them (as its kernels load them where it can)."""
        v, beta = xs["v"], xs["beta"]
        q, k = (xs[name] if l2norm else xs[name].astype(v.dtype) for name in ("q", "k"))
        gate = xs.get("a_head", jnp.zeros(beta.shape, jnp.float32))
        inputs = (layout.pad(x) for x in (q, k, v, gate, beta))
        tilings = self._gla_tiling(v.dtype), self.tiling
        out, final = delta_chunked(*tilings, scale, layout.chunk, l2norm, *inputs, init)
        return layout.unpad(out), final

    def decode(self, step, tokens, init):
        return fused_step(step, tokens, init, self.tiling)

    def check(self, *, dk: int, dv: int, chunk: int, recurrent: bool, one_token: bool) -> None:
        del chunk
        if recurrent and not one_token:
            raise NotImplementedError(
                f"{WHO} runs the chunked form and one-token steps of an unpacked batch; the token-by-token form "
                "(per-value-channel gates, use_chunked=False, packed decoding) runs on xla"
            )
        for name, size in (("dim_k", dk), ("dim_v", dv)):
            if size < 16 or size > 256 or size & (size - 1):
                raise NotImplementedError(f"{WHO} takes {name} a power of two in [16, 256], got {size}")


def triton_engine(cfg, interpret: bool | None = None) -> TritonEngine:
    """The engine for `cfg`: `fwd_params.block_d` value columns per program, warps and stages of the one-token and
    state-pass kernels (those not set: each kernel's own, `TritonStatePassTiling.resolved`); the fields set in
    `cfg.triton_tiling` (read by name: GLA's `GLAttentionTritonTiling`) replace the GLA kernels' defaults
    (`TritonGlaTiling`)."""
    params = getattr(cfg, "fwd_params", None)
    tiling = getattr(cfg, "triton_tiling", None)
    return TritonEngine(
        TritonStatePassTiling(
            block_v=getattr(params, "block_d", None),
            num_warps=getattr(params, "num_warps", None),
            num_stages=getattr(params, "num_stages", None),
            interpret=resolve_interpret(interpret, WHO),
        ),
        TritonGlaTiling() if tiling is None else TritonGlaTiling(**tiling.overrides()),
    )


def _on_triton(entry):
    """`entry` (a shared entry point) with its sequential parts in Triton kernels: the entry itself, its engine
    bound (no frame of its own between the registry and the entry); `interpret=True` forces interpret mode."""
    bound = functools.partial(entry, engine=triton_engine)
    bound.__doc__ = f"`{entry.__name__}` with its heavy parts in Pallas-Triton kernels (see this module)."
    return bound


gla_attention_triton = _on_triton(entries.gla_attention)
lightning_attention_triton = _on_triton(entries.lightning_attention)
recurrent_attention_triton = _on_triton(entries.recurrent_attention)
kernel_delta_attention_triton = _on_triton(entries.kernel_delta_attention)
gated_delta_rule_triton = _on_triton(entries.gated_delta_rule)
