"""Thirty-second session, the Mosaic GPU FP8 x FP8 grouped matmul forward on the spans schedule (issue 45: 1.4x our
bf16 forward at M 32768, K 4096, N 1536, 64 groups, bf16 output; the FP8 default was 0.695 ms, bf16 0.751-0.778).
Session 31's timing loop (`exp/s31_fp8gmm2.py`: both lhs pre-passes and a copy of lhs beside the rows) over:

- `bf16 auto` (our bf16 forward) and `bf16 spans pp` (the bf16 Mosaic GPU kernel on spans, ping-pong: 0.753 ms);
- `fp8 tiles`: 128 x 256 row tiles, 3 stages, a K pass per group of a straddling tile (the other warpgroup idle:
  session 31's default, 0.695 ms; since spans became `GroupedMatmulConfig`'s default, `spans=False`);
- `fp8 spans s3` / `s4`: `GroupedMatmulMosaicFp8Tiling(spans=True)`, every output tile in one group (one K pass,
  only its own rows stored from an untiled output tile); `s4`: a 4-stage ring, the output tile stored in four
  64-column pieces through a quarter of the shared memory; `fp8 spans 128x128 s5`: narrower tiles, deeper ring.

    PYTHONPATH=src python exp/s32_fp8spans.py            # on an H100/H200, about two minutes with compilation
    PYTHONPATH=src python exp/s32_fp8spans.py --only "fp8 tiles,fp8 spans s4"

One flushed line a row: ms, TFLOP/s (2·M·K·N), the ratio to bf16 auto, and each FP8 output against `fp8 tiles`'
(`rel`: the same codes, so float32 summation order and the bf16 output only) and bf16's.
"""

from __future__ import annotations

from s31_fp8gmm2 import main

from ejkernel.modules import GroupedMatmulConfig
from ejkernel.modules import GroupedMatmulMosaicFp8Tiling as Tiling
from ejkernel.ops import FwdParams

REFERENCE = "fp8 tiles"
TILINGS = {
    REFERENCE: Tiling(spans=False),
    "fp8 spans s3": Tiling(spans=True),
    "fp8 spans s4": Tiling(spans=True, num_stages=4),
    "fp8 spans 128x128 s5": Tiling(spans=True, block_n=128, num_stages=5),
}
BF16 = {
    "bf16 spans pp": GroupedMatmulConfig(
        platform="pallas",
        mosaic_spans=True,
        fwd_params=FwdParams(block_q=128, block_d=128, block_k=64, num_warps=4),
    ),
}

if __name__ == "__main__":
    main(TILINGS, REFERENCE, __doc__, BF16)
