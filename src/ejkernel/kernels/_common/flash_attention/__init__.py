"""The flash attention in plain JAX that every platform may share: blockwise, memory linear in length, with
its custom VJP. One module per stage:

- `tiles`: `AttentionSpec` (what a call asks for) and `FlashPass` (one pass's padded inputs, a tile's scores,
  mask and dropout, which blocks see which);
- `forward`: `attention_forward`, the chunked online softmax (output, log-sum-exp, row max);
- `backward`: `attention_backward`, the cotangents recomputed tile by tile from the saved output;
- `entry`: `flash_attention_xla`, the argument checks around the custom VJP: the XLA platform's
  implementation, and the differentiated path of kernels that only run a forward (Triton flash_mla).

Ring attention runs `attention_forward` / `attention_backward` on one block of a longer sequence at a time.
Nothing here imports `ejkernel.ops`, `ejkernel.modules` or the registry.
"""
