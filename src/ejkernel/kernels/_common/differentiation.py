"""Kernels whose gradient is that of a plain-JAX twin (inference kernels inside a trained model, one-token
steps, backwards that have no kernel of their own yet), in two forms:

- `differentiated_as`: the forward runs the kernel, the backward recomputes the twin and differentiates it
  (keeps only the inputs between the passes);
- `trained_as`: calls that are not differentiated run the kernel; differentiated ones run the twin alone,
  forward and backward (no kernel run, no recompute: for twins with memory-lean VJPs of their own).
"""

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


def trained_as(reference, forward):
    """`forward(*args)` (a kernel) where no derivative is taken; `reference(*args)` and its VJP where one is.

    `jax.custom_vjp` runs its primal only where no derivative is taken (also under jit, vmap, checkpoint) and
    its forward rule where one is, so training pays for the reference once instead of kernel + recompute.
    """

    @jax.custom_vjp
    def run(*args):
        return forward(*args)

    def run_fwd(*args):
        return jax.vjp(reference, *args)

    def run_bwd(pullback, cotangents):
        return pullback(cotangents)

    run.defvjp(run_fwd, run_bwd)
    return run
