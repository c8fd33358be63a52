"""Fingerprints of the Mosaic GPU flash attention's lowered CUDA modules, to show a refactoring changed nothing.

    PYTHONPATH=$PWD/src python tools/mosaic_fa_modules.py OUT.json [--dump DIR]

Lowers forward + every gradient of each lowering case of `tests/flash_attention/test_mosaic_gpu.py` (and
a forward alone) for CUDA on this host, and records per case the SHA-256 of each Mosaic GPU kernel module
as printed before serialisation without locations, and of the surrounding StableHLO module with its
locations and the kernels' serialised bytes (which embed locations) removed. Two runs whose JSON files
are equal lowered byte-identical kernels.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests" / "flash_attention"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))

import jax
import jax.experimental.mosaic.gpu.core as mosaic_core
import jax.numpy as jnp
from jax import export

CAPTURED: list[str] = []
_serde = mosaic_core._run_serde_pass


def _capture(module, *, serialize, **kwargs):
    if serialize:
        CAPTURED.append(module.operation.get_asm(enable_debug_info=False))
    return _serde(module, serialize=serialize, **kwargs)


mosaic_core._run_serde_pass = _capture


def _strip(text: str) -> str:
    text = re.sub(r'module = "(?:[^"\\]|\\.)*"', 'module = "<kernel>"', text)
    text = re.sub(r'kernel_hash = "(?:[^"\\]|\\.)*"', 'kernel_hash = "<hash>"', text)
    text = re.sub(r"\s*loc\((?:[^()]|\([^()]*\))*\)", "", text)
    return "\n".join(line for line in text.splitlines() if not line.startswith("#loc"))


def fingerprints(dump: pathlib.Path | None = None) -> dict[str, list[str]]:
    from test_mosaic_gpu import CASES

    from ejkernel.kernels._pallas.gpu.flash_attention._interface import mosaic_attention
    from ejkernel.ops import BwdParams, FwdParams

    out = {}
    for name, (q_shape, kv_shape, options, sinks, tiles, _) in CASES.items():
        params = {}
        if tiles:
            params = {
                "fwd_params": FwdParams(block_k=tiles[0], num_stages=tiles[3]),
                "bwd_params": BwdParams(block_k=tiles[1], block_q=tiles[2], num_stages=tiles[3]),
            }
        opts = {"causal": False, "sliding_window": None, **options}

        def loss(q, k, v, aux, opts=opts, params=params):
            return jnp.sum(mosaic_attention(q, k, v, aux, softmax_scale=0.1, **opts, **params).astype(jnp.float32))

        shapes = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in (q_shape, kv_shape, kv_shape)]
        aux = jax.ShapeDtypeStruct((q_shape[2],), jnp.float32) if sinks else None
        argnums = (0, 1, 2, 3) if sinks else (0, 1, 2)
        for mode, fn in (("grad", jax.value_and_grad(loss, argnums)), ("fwd", loss)):
            CAPTURED.clear()
            top = export.export(jax.jit(fn), platforms=["cuda"])(*shapes, aux).mlir_module()
            texts = [_strip(top), *CAPTURED]
            out[f"{name}/{mode}"] = [hashlib.sha256(t.encode()).hexdigest() for t in texts]
            if dump is not None:
                for i, t in enumerate(texts):
                    (dump / f"{name}-{mode}-{i}.mlir").write_text(t)
            print(name, mode, len(CAPTURED), "kernels", flush=True)
    return out


if __name__ == "__main__":
    dump = None
    if "--dump" in sys.argv:
        dump = pathlib.Path(sys.argv[sys.argv.index("--dump") + 1])
        dump.mkdir(parents=True, exist_ok=True)
    pathlib.Path(sys.argv[1]).write_text(json.dumps(fingerprints(dump), indent=1, sort_keys=True))
