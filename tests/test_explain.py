"""`ejkernel.explain` answers for every op: the config and its tier, the implementation and what declined."""

import jax
import jax.numpy as jnp
import pytest

import ejkernel
from ejkernel.modules import FlashAttentionConfig
from ejkernel.ops import overlay_cache
from reliability.test_configs_change_nothing import CASES

pytestmark = pytest.mark.lowest


@pytest.mark.parametrize("op", sorted(CASES))
def test_explain_names_config_tier_and_implementation(op):
    args, options = CASES[op]()
    lines = ejkernel.explain(op, *args, **options).lines
    assert any(": config " in line and " from the " in line for line in lines), lines
    assert any(" serves the call (platform='auto')" in line for line in lines), lines


def test_explain_reports_the_tier_and_takes_shapes_only():
    q = jax.ShapeDtypeStruct((1, 64, 2, 16), jnp.float32)
    cfg = FlashAttentionConfig(platform="xla")
    assert "from the cfg= argument" in str(ejkernel.explain("flash_attention", q, q, q, cfg=cfg))
    with overlay_cache({"flash_attention": cfg}):
        assert "from the overlay" in str(ejkernel.explain(ejkernel.modules.flash_attention, q, q, q))
    with pytest.raises(ValueError, match="explain: op must be"):
        ejkernel.explain("FlashAttention", q, q, q)


def test_explain_says_one_config_serves_forward_and_train_calls():
    """A trainable call whose two modes select one config logs it once, for both, whether differentiated or not
    (`test_selection` checks the line of a call whose modes differ)."""
    from ejkernel.modules import flash_attention

    q = jax.ShapeDtypeStruct((1, 64, 2, 16), jnp.float32)
    loss = lambda q: flash_attention(q, q, q).sum()
    for explained in (ejkernel.explain("flash_attention", q, q, q), ejkernel.explain(jax.grad(loss), q)):
        configs = [line for line in explained.lines if ": config " in line]
        assert len(configs) == 1 and configs[0].endswith("from the heuristics, forward and train calls alike")
