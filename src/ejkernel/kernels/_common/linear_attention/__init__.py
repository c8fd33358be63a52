"""What every platform of the linear-attention family shares (GLA, lightning, recurrent attention, the delta
rules, the ragged gated delta rule, and Mamba-2's SSD on their chunked core), one module per concern:

- `checks`: the argument checks every entry and public function raises the same words from;
- `inputs`: what the arguments become before the recurrence (q/k L2 norm, lightning's decays, segment
  restarts, the delta rules' inputs);
- `numerics`: the chunked form's blocks (`decay_matrix`, `gated_scores`, `diagonal_chunk` / `delta_chunk`
  into `ChunkParts`, the WY/UT transform) and the one-token steps (`diagonal_step`, `delta_step`);
- `layout`: `ChunkLayout`, per-token arrays cut into chunks and back, packed sequences included;
- `scan`: the chunked and recurrent forms with their custom VJPs; `ScanPasses`, the sequential passes a
  platform may run in its own kernels;
- `driver`: `linear_attention` on an `Engine` (where a platform runs the sequential parts) and
  `chunked_linear_attention`;
- `entries`: the five ops as every platform serves them, over an engine;
- `ragged`: the ragged gated delta rule's shared parts and its decode step.

Nothing here imports `ejkernel.ops` or `ejkernel.modules`; the `Kernel` classes and configs are in
`ejkernel.modules.operations._linear_attention`.
"""
