"""Issue 41, session 31: the programs of a set of public calls, to show that a change of the Python path (frames,
where checks and defaults run) changes nothing compiled.

    PYTHONPATH=<tree>/src python exp/s31_gla41_hlo.py dump DIR      # one text file per call, and hashes.json
    python exp/s31_gla41_hlo.py compare DIR_BEFORE DIR_AFTER        # identical or not, call by call

Run `dump` once with the tree before the change on PYTHONPATH and once with the tree after, both copied to one
path (the Triton kernels' IR names its source files). Calls: GLA,
lightning, recurrent attention, the kernel delta rule, the gated delta rule and flash attention through their
public functions, forward and `value_and_grad`; on XLA the CPU-compiled HLO (metadata, which names source lines,
stripped), on Triton the StableHLO lowered for CUDA (an H100, as the tests lower it on a CPU host) with the
Triton kernels' IR inside. No GPU is used: for the Triton calls the registry is told the device is a GPU.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
import sys
import types
import unittest.mock

import jax
import jax.numpy as jnp
import numpy as np


def _inputs():
    rng = np.random.default_rng(41)
    normal = lambda *s: jnp.asarray(rng.standard_normal(s, np.float32))
    decay = lambda *s: -jnp.asarray(rng.random(s, np.float32))
    b, s, h, d = 2, 64, 2, 16
    return dict(
        q=normal(b, s, h, d),
        k=normal(b, s, h, d),
        v=normal(b, s, h, d),
        gk=decay(b, s, h, d),
        gh=decay(b, s, h),
        beta=jax.nn.sigmoid(normal(b, s, h)),
        h0=normal(b, h, d, d),
    )


def _calls(platform: str):
    """`name -> (function of the differentiated arrays, those arrays)`, each returning one float array."""
    import ejkernel.modules as m

    x = _inputs()
    q, k, v = x["q"], x["k"], x["v"]
    calls = {
        "gla": (lambda q, k, v, g: m.gla_attention(q, k, v, g, platform=platform), (q, k, v, x["gk"])),
        "gla_state": (
            lambda q, k, v, h0: m.gla_attention(
                q, k, v, x["gk"], None, h0, softmax_scale=0.3, return_state=True, platform=platform
            )[1],
            (q, k, v, x["h0"]),
        ),
        "lightning": (
            lambda q, k, v: m.lightning_attention(q, k, v, layer_idx=1, num_layers=4, platform=platform),
            (q, k, v),
        ),
        "recurrent": (lambda q, k, v, g: m.recurrent_attention(q, k, v, g, platform=platform), (q, k, v, x["gh"])),
        "kernel_delta": (
            lambda q, k, v: m.kernel_delta_attention(q, k, v, x["beta"], x["gh"], platform=platform),
            (q, k, v),
        ),
        "gated_delta_rule": (
            lambda q, k, v: m.gated_delta_rule(q, k, v, x["beta"], x["gh"], platform=platform)[0],
            (q, k, v),
        ),
        "flash": (lambda q, k, v: m.flash_attention(q, k, v, causal=True, platform=platform), (q, k, v)),
    }
    return calls


def _programs(platform: str):
    """`name -> text` of every call's forward and value_and_grad program on `platform`."""
    out = {}
    for name, (fn, args) in _calls(platform).items():
        loss = lambda *a, fn=fn: jnp.sum(fn(*a).astype(jnp.float32) ** 2)
        train = jax.value_and_grad(loss, argnums=tuple(range(len(args))))
        for mode, f in (("forward", fn), ("value_and_grad", train)):
            if platform == "xla":
                text = jax.jit(f).lower(*args).compile().as_text()
                text = re.sub(r", metadata=\{[^}]*\}", "", text)
                text = re.sub(r"\nFileNames\n.*?\n\n(?=%|ENTRY)", "\n", text, flags=re.S)  # the source tables
            else:
                text = jax.jit(f).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
            out[f"{platform}_{name}_{mode}"] = text
    return out


def _on_a_gpu():
    """Patches under which the public functions choose and lower their Triton kernels on this CPU host: the
    registry sees a GPU, the kernels compile (no interpret mode) for compute capability 9.0."""
    from jax._src.pallas.triton import pallas_call_registration

    info = types.SimpleNamespace(compute_capability=90)
    return (
        unittest.mock.patch.object(jax, "default_backend", lambda: "gpu"),
        unittest.mock.patch.object(pallas_call_registration.gpu_info_lib, "get_gpu_info", lambda: info),
    )


def dump(directory: str) -> None:
    # Source locations are debug data, not the program: the Triton kernels' IR would otherwise carry the Python
    # frames that traced each operation (the path this change shortens).
    jax.config.update("jax_include_full_tracebacks_in_locations", False)
    jax.config.update("jax_traceback_in_locations_limit", 0)
    target = pathlib.Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    programs = _programs("xla")
    first, second = _on_a_gpu()
    with first, second:
        programs.update(_programs("triton"))
    hashes = {}
    for name, text in programs.items():
        (target / f"{name}.txt").write_text(text)
        hashes[name] = hashlib.sha256(text.encode()).hexdigest()
        print(f"{name}: {hashes[name][:16]} ({len(text)} characters)")
    (target / "hashes.json").write_text(json.dumps(hashes, indent=1, sort_keys=True))


def compare(before: str, after: str) -> int:
    a = json.loads((pathlib.Path(before) / "hashes.json").read_text())
    b = json.loads((pathlib.Path(after) / "hashes.json").read_text())
    differ = sorted(n for n in a.keys() | b.keys() if a.get(n) != b.get(n))
    for name in sorted(a.keys() | b.keys()):
        print(f"{name}: {'identical' if name not in differ else 'DIFFERENT'}")
    print(f"{len(a.keys() | b.keys()) - len(differ)} identical, {len(differ)} different")
    return 1 if differ else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["dump"] and len(sys.argv) == 3:
        dump(sys.argv[2])
    elif sys.argv[1:2] == ["compare"] and len(sys.argv) == 4:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
