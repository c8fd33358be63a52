"""The Pallas TPU serving kernel (`page_attention`, `ragged_page_attention_v3`) in TPU interpret mode.

Grids stay small (about 10 ms per step): 4 tiles x 6 page steps, and 6 tiles x 5 steps.
"""

import jax.numpy as jnp
import numpy as np
import pytest
from paged_cases import CASES, jitted_reference, output_of, unified_case

from ejkernel import kernel_registry
from ejkernel.kernels._common.paged_attention.adapters import prefill_batch, unified_batch
from ejkernel.kernels._pallas.tpu.paged_attention._interface import plan
from ejkernel.modules.operations.page_attention import PagedAttentionConfig
from ejkernel.ops import FwdParams
from harness import assert_close


@pytest.mark.parametrize(
    ("op", "case", "options"),
    [
        ("page_attention", {}, {"sliding_window": 19, "attn_logits_soft_cap": 2.0}),  # head-major pages
        ("ragged_page_attention_v3", {"mixed": (1, 2, 4), "dtype": jnp.bfloat16}, {"v_scale": 2.0}),  # packed pages
    ],
)
def test_forward_matches_reference(op, case, options):
    args, base = CASES[op](np.random.default_rng(6), **case)
    options = {**base, **options}
    cfg = PagedAttentionConfig(fwd_params=FwdParams(block_q=4))
    out = output_of(op)(kernel_registry.get(op, "pallas", "tpu")(*args, cfg=cfg, **options))
    assert_close(out, jitted_reference(op, options)(*args), out.dtype)


def test_declines_what_it_cannot_serve():
    args, _ = unified_case(np.random.default_rng(2))
    with pytest.raises(NotImplementedError, match="ALiBi"):
        plan(unified_batch(*args), None, True)
    args, _ = CASES["prefill_page_attention"](np.random.default_rng(2))
    with pytest.raises(NotImplementedError, match="whole pages"):
        plan(prefill_batch(*args), None, True)
