"""Session 58 (prepared): flash-linear-attention's `chunk_gla` forward stage by stage, beside which ours is known
(session 57's timeline at B 2, S 16384, H 16, D 128: cumulative gates 136 us, scores 378, states 713, outputs 441;
1.67 ms against fla's 1.49 in the anchors). Torch's profiler never printed fla's kernels (sessions 56-58: its
backward's autotuning outlasted 300 s), so each forward stage is timed alone by CUDA events, in its own call, as
`fla.ops.gla.chunk.chunk_gla_fwd` runs them (chunk 64, the gates summed in base 2); `s35_fla_serving.timed`.

    python3 exp/s58_fla_gla_forward.py   # torch, triton and the fla-core wheel
"""

import torch
import torch.nn.functional as F
from fla.ops.common.chunk_h import chunk_fwd_h
from fla.ops.gla.chunk import chunk_gla_fwd_intra_gk, chunk_gla_fwd_o_gk
from fla.ops.utils.constant import RCP_LN2
from fla.ops.utils.cumsum import chunk_local_cumsum
from s35_fla_serving import timed

BATCH, SEQ, HEADS, DIM, CHUNK = 2, 16384, 16, 128, 64


def main() -> None:
    q, k, v = (torch.randn(BATCH, SEQ, HEADS, DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    g = F.logsigmoid(torch.randn(BATCH, SEQ, HEADS, DIM, device="cuda")) / 16
    scale = DIM**-0.5
    cumsum = lambda: chunk_local_cumsum(g, CHUNK, scale=RCP_LN2)
    gc = cumsum()
    states = lambda: chunk_fwd_h(k=k, v=v, gk=gc, h0=None, output_final_state=False, chunk_size=CHUNK)
    h = states()[0]
    scores = lambda: chunk_gla_fwd_intra_gk(q=q, k=k, g=gc, scale=scale, chunk_size=CHUNK)
    a = scores()
    outputs = lambda: chunk_gla_fwd_o_gk(q=q, v=v, g=gc, A=a, h=h, scale=scale, chunk_size=CHUNK)
    outputs()
    for name, fn in (("cumulative gates", cumsum), ("states", states), ("scores", scores), ("outputs", outputs)):
        print(f"fla chunk_gla forward, {name:16s} {1e6 * timed(fn, repeats=20, calls=10):8.1f} us", flush=True)


if __name__ == "__main__":
    main()
