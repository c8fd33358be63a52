"""Kernels whose gradient is that of a plain-JAX twin: the forward runs the kernel, the backward recomputes
the twin and differentiates it (inference kernels inside a trained model, one-token steps, backwards that
have no kernel of their own yet)."""

from __future__ import annotations

import jax


def differentiated_as(reference, forward):
    """`forward(*args)` (a kernel, not differentiable) with the VJP of `reference(*args)`, the same function
    in differentiable code, recomputed in the backward."""

    @jax.custom_vjp
    def run(*args):
        return forward(*args)

    def run_fwd(*args):
        return forward(*args), args

    def run_bwd(args, cotangents):
        return jax.vjp(reference, *args)[1](cotangents)

    run.defvjp(run_fwd, run_bwd)
    return run
