"""The serving ops' Pallas TPU core: which calls the kernel serves, its plan, and the plain-JAX backward."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ejkernel.kernels._common.differentiation import differentiated_as
from ejkernel.kernels._common.paged_attention.core_math import span_bound
from ejkernel.kernels._common.paged_attention.implementations import config_tiling
from ejkernel.kernels._common.paged_attention.jax_core import default_block_q, paged_attention_core
from ejkernel.kernels._common.paged_attention.kv_cache import kv_packing
from ejkernel.kernels._common.paged_attention.problem import PagedBatch
from ejkernel.kernels._common.paged_attention.tiles import finish_tiles, prepare_tiles
from ejkernel.kernels._pallas.tpu import resolve_interpret
from ejkernel.kernels._pallas.tpu.paged_attention._kernel import Plan, partial_sums

SUPPORTED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32))
MAX_ROWS = 128
WHO = "pallas tpu paged attention"


def plan(batch: PagedBatch, cfg, interpret) -> Plan:
    """The kernel's plan for `batch`; NotImplementedError for layouts, dtypes and options it does not serve."""
    st, layout = batch.static, batch.static.rows
    for name, x in (("queries", batch.queries), ("cache", batch.key_rows)):
        if jnp.dtype(x.dtype) not in SUPPORTED_DTYPES:
            raise NotImplementedError(f"{WHO} takes bfloat16/float32 {name}, got {x.dtype}")
    if batch.alibi_slopes is not None or batch.qq_bias is not None or st.compute_dtype is not None:
        raise NotImplementedError(f"{WHO} has no ALiBi, query-query bias or compute dtype")
    head_major = layout.slot_stride == 1 and layout.head_stride == layout.page_size
    slot_major = layout.page_stride == layout.page_size * layout.slot_stride and layout.head_stride < layout.slot_stride
    if not (head_major or slot_major):
        raise NotImplementedError(f"{WHO} reads whole pages of one cache array per step")
    packing = 1 if head_major else kv_packing(batch.key_rows.dtype)
    if layout.slot_stride % packing:
        packing = 1
    group = batch.num_heads // st.num_kv_heads
    block_q = config_tiling(cfg, layout.page_size).block_q or min(default_block_q(batch), max(1, MAX_ROWS // group))
    table_width = batch.page_tables.shape[1]
    interpret = resolve_interpret(interpret)
    return Plan(
        block_q=block_q,
        rows=-(-block_q * group // 8) * 8,
        steps=max(1, min(table_width, -(-span_bound(st, block_q) // layout.page_size) + 1)),
        head_major=head_major,
        packing=packing,
        interpret=interpret,
    )


def _forward(p: Plan, batch: PagedBatch) -> jax.Array:
    tiles, meta, q_tiles, _ = prepare_tiles(batch, p.block_q, p.rows, batch.key_rows.shape[1])
    acc, m, denom = partial_sums(batch, meta, q_tiles, p)
    return finish_tiles(batch, tiles, p.block_q, acc, m, denom)


def paged_attention_tpu_core(batch: PagedBatch, cfg=None, interpret=None) -> jax.Array:
    """`[T, Hq, D]` paged attention of `batch` through the TPU kernel (TPU interpret mode off TPU)."""
    p = plan(batch, cfg, interpret)
    if batch.num_tokens == 0 or batch.num_seqs == 0:
        return paged_attention_core(batch)
    # Inference ops must not break the gradient of a model around them: the plain-JAX core's exact gradient.
    return differentiated_as(paged_attention_core, functools.partial(_forward, p))(batch)
