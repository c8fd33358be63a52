"""Issue 45's alternative for 8-bit KV decode: vLLM's Triton unified attention (vendored in the anchors, vLLM 0.22.0)
on a bf16 cache, an fp8 cache with per-token-head scales and an int8 one, at issue 45's shape (batch 64, context
8192, Hq 32, Hkv 8, D 128, page 16), split-K as vLLM's backend runs decode; ms, cache bytes per second, speed-up
against its own bf16 and relative error against it. torch; not part of the package.

On the device: copy `../shared/anchors/vllm_triton` into `.anchors/vllm_triton` (listed in `.git/info/exclude`),
carry `.anchors`, and run `VLLM_TRITON=.anchors/vllm_triton python3 exp/s29_vllm_kv_quant.py`.
"""

import math
import os
import statistics
import sys

import torch

sys.path.insert(0, os.environ.get("VLLM_TRITON", ".anchors/vllm_triton"))
import triton
from triton_unified_attention import KVQuantMode, unified_attention

BATCH, CONTEXT, HQ, HKV, D, PAGE, SEGMENTS = 64, 8192, 32, 8, 128, 16, 16


def median_ms(fn, reps=30):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def quantize(x, dtype):
    """Codes and `[blocks, page, heads]` scales, one per token-head: `max|x| / code max` over the head dim."""
    top = 127.0 if dtype == torch.int8 else torch.finfo(dtype).max
    scale = (x.abs().amax(-1).float() / top).clamp_min(1e-12)
    codes = (x.float() / scale[..., None]).clamp(-top, top)
    return (codes.round() if dtype == torch.int8 else codes).to(dtype), scale


def main():
    torch.manual_seed(0)
    blocks = BATCH * CONTEXT // PAGE
    key, value = (torch.randn(blocks, PAGE, HKV, D, device="cuda").to(torch.bfloat16) for _ in range(2))
    q = torch.randn(BATCH, HQ, D, device="cuda").to(torch.bfloat16)
    table = torch.randperm(blocks, device="cuda").to(torch.int32).view(BATCH, -1)
    cu_q = torch.arange(BATCH + 1, device="cuda", dtype=torch.int32)
    lengths = torch.full((BATCH,), CONTEXT, device="cuda", dtype=torch.int32)
    ones = torch.ones((), device="cuda").expand(BATCH, HKV)
    partial = torch.empty(BATCH, HQ, SEGMENTS, triton.next_power_of_2(D), device="cuda")
    maxes, sums = (torch.empty(BATCH, HQ, SEGMENTS, device="cuda") for _ in range(2))
    variants = {"bf16": (key, value, KVQuantMode.NONE, None, None)}
    for name, dtype, mode in (
        ("fp8 per token-head", torch.float8_e4m3fn, KVQuantMode.FP8_PER_TOKEN_HEAD),
        ("int8 per token-head", torch.int8, KVQuantMode.INT8_PER_TOKEN_HEAD),
    ):
        (kc, ks), (vc, vs) = quantize(key, dtype), quantize(value, dtype)
        variants[name] = (kc, vc, mode, ks, vs)
    outputs, times = {}, {}
    for name, (k, v, mode, ks, vs) in variants.items():
        out = torch.empty_like(q)

        def run(k=k, v=v, mode=mode, ks=ks, vs=vs, out=out):
            unified_attention(
                q=q, k=k, v=v, out=out, cu_seqlens_q=cu_q, max_seqlen_q=1, seqused_k=lengths, max_seqlen_k=CONTEXT,
                softmax_scale=1 / math.sqrt(D), causal=True, window_size=(-1, -1), block_table=table, softcap=0,
                q_descale=None, k_descale=ones, v_descale=ones, seq_threshold_3D=BATCH,
                num_par_softmax_segments=SEGMENTS, softmax_segm_output=partial, softmax_segm_max=maxes,
                softmax_segm_expsum=sums, kv_quant_mode=mode, k_scale_cache=ks, v_scale_cache=vs,
            )  # fmt: skip

        times[name] = median_ms(run)
        outputs[name] = out.float().clone()
    for name, ms in times.items():
        nbytes = 2 * BATCH * CONTEXT * HKV * D * variants[name][0].element_size()
        error = float((outputs[name] - outputs["bf16"]).norm() / outputs["bf16"].norm())
        speedup = times["bf16"] / ms
        print(f"vLLM {name:20s} {ms:.3f} ms {nbytes / ms / 1e9:.2f} TB/s {speedup:.2f}x bf16, error {error:.2e}")


if __name__ == "__main__":
    main()
