"""Issue 44's serving rows beside flash-linear-attention (fla-core 0.6.0, its Triton kernels through PyTorch), the best
runnable alternative for the hybrid models' layers, on the shapes of our benches (`ejkernel bench linear_attention
--part serving`, `ejkernel bench causal_conv1d`), timed on the same GPU in the same device call as ours:

- gated delta rule decode step: 256 requests x 1 token, H 32, Dk = Dv = 128, float32 states: fla's
  `fused_recurrent_gated_delta_rule` from and to contiguous states (no pool: the bytes our op moves, without the
  slot gather), and with a pool of 512 slots read and written through `torch` indexing (what a serving engine
  does around it);
- gated delta rule ragged prefill: 8 requests x 2048 tokens, `chunk_gated_delta_rule` with `cu_seqlens`, from and
  to states; q and k normalised beforehand, and (since session 56) normalised in the call as our op does by default
  (`use_qk_l2norm_in_kernel=True`);
- causal_conv1d: 16384 tokens of 64 sequences x 8192 channels, width 4, bias and SiLU, from and to per-sequence
  states (`fla.modules.causal_conv1d.causal_conv1d`, Triton backend);
- a device copy (`x + 1` over 2 GiB of bf16) for the bandwidth scale.

CUDA events, median of `--repeats` timings of `--calls` back-to-back calls each. Writes `fla_serving.json` to
`--out`. Needs the fla-core wheel (pure Python) beside torch and triton.

    python3 exp/s35_fla_serving.py --out $OUT
"""

import argparse
import json
import pathlib
import statistics

import torch
import torch.nn.functional as F
from fla.modules.causal_conv1d import causal_conv1d
from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def timed(fn, repeats: int, calls: int) -> float:
    """Median seconds of one call."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(samples)


def gdr_inputs(tokens: int, heads: int, dim: int, device):
    x = lambda *shape: torch.randn(*shape, device=device)
    q, k = (F.normalize(x(1, tokens, heads, dim), dim=-1).to(torch.bfloat16) for _ in range(2))
    v = x(1, tokens, heads, dim).to(torch.bfloat16)
    g = -0.05 * F.softplus(x(1, tokens, heads))  # log decay, as our benches draw it
    beta = torch.sigmoid(x(1, tokens, heads))
    return q, k, v, g, beta


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--out", default="out")
    args = p.parse_args()
    device = torch.device("cuda")
    torch.manual_seed(0)
    run = lambda fn: timed(fn, args.repeats, args.calls)
    rows = {}

    big = torch.zeros(2**30, dtype=torch.bfloat16, device=device)
    copy_s = run(lambda: big + 1)
    copy_bw = 2 * big.nbytes / copy_s
    rows["copy"] = dict(ms=1e3 * copy_s, TBps=copy_bw / 1e12)

    requests, heads, dim = 256, 32, 128
    q, k, v, g, beta = gdr_inputs(requests, heads, dim, device)
    cu = torch.arange(requests + 1, device=device, dtype=torch.long)
    states = torch.randn(requests, heads, dim, dim, device=device)
    pool = torch.randn(2 * requests, heads, dim, dim, device=device)
    slots = torch.randperm(2 * requests, device=device)[:requests]

    def decode():
        return fused_recurrent_gated_delta_rule(
            q, k, v, g=g, beta=beta, initial_state=states, output_final_state=True, cu_seqlens=cu
        )

    def decode_pool():
        out, final = fused_recurrent_gated_delta_rule(
            q, k, v, g=g, beta=beta, initial_state=pool[slots], output_final_state=True, cu_seqlens=cu
        )
        pool[slots] = final
        return out

    moved = 2 * states.nbytes + 4 * q.nbytes + 2 * g.nbytes  # states read and written, q k v out, g and beta
    for name, fn in (("gdr decode, contiguous states", decode), ("gdr decode, pool by index", decode_pool)):
        seconds = run(fn)
        rows[name] = dict(ms=1e3 * seconds, TBps=moved / seconds / 1e12, ratio_to_copy=moved / seconds / copy_bw)

    requests, length = 8, 2048
    q, k, v, g, beta = gdr_inputs(requests * length, heads, dim, device)
    cu = torch.arange(0, requests * length + 1, length, device=device, dtype=torch.long)
    states = torch.randn(requests, heads, dim, dim, device=device)

    def prefill(l2norm: bool):
        return lambda: chunk_gated_delta_rule(
            q,
            k,
            v,
            g=g,
            beta=beta,
            initial_state=states,
            output_final_state=True,
            cu_seqlens=cu,
            use_qk_l2norm_in_kernel=l2norm,
        )

    rows["gdr prefill 8x2048"] = dict(ms=1e3 * run(prefill(False)))
    rows["gdr prefill 8x2048, q and k L2-normalised in the call (as ours)"] = dict(ms=1e3 * run(prefill(True)))

    tokens, channels, width, seqs = 16384, 8192, 4, 64
    x = torch.randn(1, tokens, channels, device=device, dtype=torch.bfloat16)
    weight = torch.randn(channels, width, device=device, dtype=torch.bfloat16)
    bias = torch.randn(channels, device=device, dtype=torch.bfloat16)
    conv_states = torch.randn(seqs, channels, width, device=device, dtype=torch.bfloat16)  # fla keeps W inputs
    cu = torch.arange(0, tokens + 1, tokens // seqs, device=device, dtype=torch.long)
    cu_cpu = cu.cpu()  # fla's chunk indices from the host copy, not a device sync per call

    def conv():
        return causal_conv1d(
            x, weight, bias, initial_state=conv_states, output_final_state=True, activation="silu",
            backend="triton", cu_seqlens=cu, cu_seqlens_cpu=cu_cpu,
        )  # fmt: skip

    seconds = run(conv)
    moved = 2 * x.nbytes + 2 * conv_states.nbytes
    rows["causal_conv1d 16384x8192 W4, 64 seqs"] = dict(
        ms=1e3 * seconds, TBps=moved / seconds / 1e12, ratio_to_copy=moved / seconds / copy_bw
    )

    meta = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, fla="0.6.0")
    for name, row in rows.items():
        print(f"{name:40s} " + "  ".join(f"{k} {v:.4g}" for k, v in row.items()), flush=True)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fla_serving.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
