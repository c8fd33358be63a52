"""The XLA merge of two partial attention results: one fused elementwise pass."""

from ejkernel.kernels._common.attention_states import merge_states


def merge_attention_states_xla(out_a, lse_a, out_b, lse_b, *, cfg=None):
    """`(out in out_a's dtype, lse float32)`: `merge_states`, the output cast back."""
    out, lse = merge_states(out_a, lse_a, out_b, lse_b)
    return out.astype(out_a.dtype), lse


__all__ = ["merge_attention_states_xla"]
