"""Each serving op's implementation: its adapter's signature around a platform's core, and the tiling a
config asks for (`config_tiling`), which the cores read."""

from __future__ import annotations

import dataclasses
import functools
import inspect

import jax

from ejkernel.kernels._common.paged_attention.adapters import (
    page_attention_batch,
    prefill_batch,
    ragged_decode_batch,
    ragged_v2_batch,
    ragged_v3_batch,
    unified_batch,
    written,
)


def _same(out, batch, args):
    return out


def _with_cache(out, batch, args):
    return written(out, batch, args[3])


def _query_rank(out, batch, args):
    return out.reshape(args[0].shape)


ADAPTERS = {
    "page_attention": (page_attention_batch, _same),
    "prefill_page_attention": (prefill_batch, _same),
    "ragged_page_attention_v2": (ragged_v2_batch, _same),
    "ragged_page_attention_v3": (ragged_v3_batch, _with_cache),
    "ragged_decode_attention": (ragged_decode_batch, _query_rank),
    "unified_attention": (unified_batch, _same),
}
"""Algorithm -> (adapter to a PagedBatch, what makes the op's result of the core's `[T, Hq, D]` output)."""

ARRAY_OPTIONS = frozenset({"kv_cache_scales", "key_cache_scales", "value_cache_scales"})
"""Keyword options that are arrays (traced, not static): a quantised cache's per-token-head scales."""


def implementation(algorithm: str, core, name: str):
    """Op `algorithm` as platform `core(batch, cfg) -> [T, Hq, D]` serves it, called as users call the op.

    The result takes the adapter's signature (tensors positional, options keyword with the public function's defaults)
    plus `cfg=None` (the implementation's own tiling), and is jitted with the options static (the cache scales, keywords
    too, traced), so an eager call compiles once. It trusts its arguments: the public functions in `ejkernel.modules`
    check them.
    """
    adapter, finish = ADAPTERS[algorithm]
    signature = inspect.signature(adapter)
    keywords = [p.name for p in signature.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    static = [name for name in keywords if name not in ARRAY_OPTIONS]

    @functools.partial(jax.jit, static_argnames=[*static, "cfg"])
    def run(*args, cfg=None, **options):
        batch = adapter(*args, **options)
        return finish(core(batch, cfg), batch, args)

    def impl(*args, cfg=None, **options):
        return run(*args, cfg=cfg, **options)

    cfg = inspect.Parameter("cfg", inspect.Parameter.KEYWORD_ONLY, default=None)
    impl.__signature__ = signature.replace(
        parameters=[*signature.parameters.values(), cfg], return_annotation=inspect.Signature.empty
    )
    impl.__doc__ = adapter.__doc__
    impl.__name__ = impl.__qualname__ = name
    return impl


@dataclasses.dataclass(frozen=True)
class ConfigTiling:
    """The tiling a serving op's config asks for (None: the kernel's default)."""

    block_q: int | None = None
    block_k: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    num_splits: int | None = None


def config_tiling(cfg, page_size: int) -> ConfigTiling:
    """`cfg`'s tiling: its `fwd_params` and `num_splits`, else upstream's knobs on the config
    (`num_queries_per_block`, `num_kv_pages_per_block` pages of `page_size` keys per step, `num_warps`,
    `num_stages`, `num_par_softmax_segments`), block sizes rounded up to the powers of two the kernels tile by."""
    params = getattr(cfg, "fwd_params", None)

    def pick(ours: str, upstream: str, scale: int = 1, pow2: bool = True) -> int | None:
        value = getattr(params, ours, None)
        if value is None and getattr(cfg, upstream, None) is not None:
            value = getattr(cfg, upstream) * scale
            value = 1 << (value - 1).bit_length() if pow2 else value
        return value

    splits = getattr(cfg, "num_splits", None) or getattr(cfg, "num_par_softmax_segments", None)
    return ConfigTiling(
        block_q=pick("block_q", "num_queries_per_block"),
        block_k=pick("block_k", "num_kv_pages_per_block", page_size),
        num_warps=pick("num_warps", "num_warps"),
        num_stages=pick("num_stages", "num_stages", pow2=False),
        num_splits=splits,
    )
