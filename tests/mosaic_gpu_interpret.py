"""Mosaic GPU interpret mode for the attention kernels: three things jax 0.11.2's interpreter lacks, added.

`plgpu.force_gpu_interpret_mode` runs `plgpu.kernel` bodies on a CPU (warpgroups as threads, barriers,
TMA copies and wgmma simulated, races on shared memory detected). The Mosaic GPU attention kernels use
three things it does not interpret:

- `pl.run_state` with wgmma accumulators (`plgpu.ACC.init`): run here like `run_scoped`, each state
  ref a register buffer that holds its initial value, read back when the body ends;
- `plgpu.wgmma` whose A operand is a register array (P·V, dS·K): staged here in a register buffer;
- TMA stores that add into global memory (`copy_smem_to_gmem(..., reduction_op="add")`, the fused
  backward's dQ): done here at once, under a lock (an allowed order of the asynchronous copy).

And one check is relaxed: the interpreter wants every thread that waits on a barrier to have observed
its last completed phase when the barrier is freed. The kernels leave some last phases unobserved,
which costs nothing on a GPU: the memory warpgroup's last "consumed" phases (it waits only to refill a
slot) and the forward's last turn passed between the compute warpgroups. Those threads are marked as
having seen the last phase when the barrier is freed; a thread falling two phases behind while the
kernel runs (which would confuse its parity waits) still fails, as do arrivals pending at the end.
Register buffers (a warpgroup's own: accumulators, run_state's values) are left out of race detection,
which otherwise reports a warpgroup's successive writes to the one it reallocates in each loop step.
And a TMA load into shared memory is ordered after what its issuing thread has waited for: the
interpreter orders it only after the issuer's last `commit_smem` (a proxy fence), so it reports every
refill of a ring slot whose previous contents a compute warpgroup read with plain loads (log-sum-exp,
delta) and released through the slot's "consumed" barrier; pipelines on the GPU (CUTLASS's, these
kernels') rely on that barrier alone for this write-after-read. Writes by threads followed by TMA reads
(stores to global memory) still need their `commit_smem`, and missing ones are still reported.

Everything else goes through the interpreter unchanged: a jaxpr holding none of these is handed to
it whole; otherwise it gets the runs of equations between them. Like the interpreter, this models
neither wgmma's asynchrony nor layouts and swizzles (only a GPU checks those). Use `interpret_mode()`.
"""

from __future__ import annotations

import contextlib
import pathlib
import subprocess
import sys
import threading

from jax._src import core as jax_core
from jax._src.linear_util import DebugInfo
from jax._src.pallas.mosaic_gpu import core as gpu_core
from jax._src.pallas.mosaic_gpu import primitives as gpu_primitives
from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks, jaxpr_interpret
from jax._src.pallas.mosaic_gpu.interpret import shared_memory as memory
from jax._src.pallas.mosaic_gpu.interpret.gpu_callbacks import HostAllocationKey, _remove_noop_transforms
from jax._src.pallas.mosaic_gpu.interpret.race_detection_state import GPURaceDetectionState
from jax._src.state import discharge
from jax._src.state import types as state_types
from jax.experimental.pallas import mosaic_gpu as plgpu

_INTERPRET = jaxpr_interpret.JaxprInterpreter.interpret
_DEALLOCATE = memory.Barrier.deallocate
_CHECKS = {name: getattr(GPURaceDetectionState, name) for name in ("check_read", "check_write")}
_REGS = memory.get_memory_space_idx(gpu_core.MemorySpace.REGS)
_TMA_LOAD_WRITTEN = gpu_callbacks.AsyncCopyGmemToSmemTask.post_read
_COPY_SMEM_TO_GMEM = gpu_callbacks.copy_smem_to_gmem
_ADD_LOCK = threading.Lock()


def _register_a(eqn) -> bool:
    return eqn.primitive is gpu_primitives.wgmma_ref_p and not isinstance(eqn.invars[1].aval, state_types.AbstractRef)


def _needs_help(eqn) -> bool:
    return eqn.primitive is discharge.run_state_p or _register_a(eqn)


def _buffer(self, token, value, source_info):
    """A register buffer of this thread holding `value` -> (token, its key)."""
    token, request = gpu_callbacks.call_make_allocation_request_array(
        token=token,
        compute_unit=self.thread,
        memory_space_id=memory.get_memory_space_idx(gpu_core.MemorySpace.REGS),
    )
    return gpu_callbacks.call_allocate_buffer(
        token=token,
        mesh_location=self.mesh_location,
        thread=self.thread,
        allocation_request_as_array=request,
        value=value,
        source_info=source_info,
    )


def _free(self, token, key, source_info):
    return gpu_callbacks.call_deallocate_buffer(
        token=token,
        mesh_location=self.mesh_location,
        thread=self.thread,
        allocation_key_as_array=key,
        source_info=source_info,
    )


def _run_state(self, eqn, token, values):
    """Refs passed in (closed-over shared memory) stay themselves; values get a register buffer each."""
    body = eqn.params["jaxpr"]
    keys, owned = [], []
    for var, value in zip(eqn.invars, values, strict=True):
        if isinstance(var.aval, state_types.AbstractRef):
            keys.append(value)
        else:
            token, key = _buffer(self, token, value, eqn.source_info)
            keys.append(key)
            owned.append(key)
    token, _ = self.interpret(body, token, *keys)
    outs = []
    for key, var, out_var in zip(keys, body.invars, eqn.outvars, strict=True):
        if isinstance(out_var.aval, state_types.AbstractRef):
            outs.append(key)
            continue
        token, out = gpu_callbacks.call_get(
            token=token,
            result_shape_and_dtype=var.aval.inner_aval,
            mesh_location=self.mesh_location,
            thread=self.thread,
            allocation_key_as_array=key,
            transforms=(),
            source_info=eqn.source_info,
        )
        outs.append(out)
    for key in owned:
        token = _free(self, token, key, eqn.source_info)
    return token, outs


def _wgmma_register_a(self, eqn, token, values):
    acc, a, b, *leaves = values
    token, key = _buffer(self, token, a, eqn.source_info)
    token, outs = self._interpret_wgmma_ref_p(eqn, token, lambda: [acc, key, b, *leaves])
    return _free(self, token, key, eqn.source_info), outs


def _interpret(self, jaxpr, token, *args):
    """The interpreter on the runs of `jaxpr` between the equations it lacks, which are done here."""
    if not any(_needs_help(eqn) for eqn in jaxpr.eqns):
        return _INTERPRET(self, jaxpr, token, *args)
    env = dict(zip(jaxpr.constvars + jaxpr.invars, args, strict=True))

    def read(var):
        return var.val if isinstance(var, jax_core.Literal) else env[var]

    def used_from(index):
        used = {v for eqn in jaxpr.eqns[index:] for v in eqn.invars if not isinstance(v, jax_core.Literal)}
        return used | {v for v in jaxpr.outvars if not isinstance(v, jax_core.Literal)}

    run: list = []

    def flush(token, next_index):
        if not run:
            return token
        defined = {v for eqn in run for v in eqn.outvars}
        needed = used_from(next_index)
        invars = list(
            dict.fromkeys(v for eqn in run for v in eqn.invars if not isinstance(v, jax_core.Literal) and v in env)
        )
        outvars = [v for eqn in run for v in eqn.outvars if v in needed and not isinstance(v, jax_core.DropVar)]
        effects = jax_core.join_effects(*(eqn.effects for eqn in run))
        info = DebugInfo("mosaic gpu interpret run", "<run of equations>", None, None)
        part = jax_core.Jaxpr([], invars, outvars, list(run), effects, info)
        token, outs = _INTERPRET(self, part, token, *(env[v] for v in invars))
        env.update(zip(outvars, outs, strict=True))
        assert defined >= set(outvars)
        run.clear()
        return token

    for index, eqn in enumerate(jaxpr.eqns):
        if not _needs_help(eqn):
            run.append(eqn)
            continue
        token = flush(token, index)
        values = [read(v) for v in eqn.invars]
        handler = _run_state if eqn.primitive is discharge.run_state_p else _wgmma_register_a
        token, outs = handler(self, eqn, token, values)
        for var, out in zip(eqn.outvars, outs, strict=True):
            if not isinstance(var, jax_core.DropVar):
                env[var] = out
    token = flush(token, len(jaxpr.eqns))
    return token, [read(v) for v in jaxpr.outvars]


def _copy_smem_to_gmem(*, reduction_op, **kwargs):
    """A TMA store; one that adds (`reduction_op="add"`) is done at once, read-add-write under a lock."""
    if reduction_op is None:
        return _COPY_SMEM_TO_GMEM(reduction_op=reduction_op, **kwargs)
    if str(reduction_op) != "add" or kwargs.get("predicate") is not None:
        raise NotImplementedError(f"interpret mode: TMA store with reduction {reduction_op!r}")
    thread = kwargs["thread"]
    shared = gpu_callbacks._get_shared_memory()
    info = memory.GPULoggingInfo(kwargs["mesh_location"], thread, kwargs["source_info"])
    ends = []
    for side in ("src", "dst"):
        key = HostAllocationKey.from_array(kwargs[f"{side}_allocation_key_as_array"])
        transforms = _remove_noop_transforms(kwargs[f"{side}_transforms"])
        ends.append((key, shared.access(key, transforms)))
    (src_key, src_access), (dst_key, dst_access) = ends
    with _ADD_LOCK:
        src = shared.get_buffer_content(src_key, src_access, thread, logging_info=info)[0]
        dst = shared.get_buffer_content(dst_key, dst_access, thread, logging_info=info)[0]
        shared.store_buffer_content(dst_key, dst_access, dst + src.astype(dst.dtype), thread, logging_info=info)
    return kwargs["token"]


def _deallocate_barrier(self):
    with self.cv:  # (a reentrant lock: the interpreter's deallocate takes it again)
        if self.ref_count == 1:
            for thread in self.last_observed_phase_by_thread:
                self.last_observed_phase_by_thread[thread] = self.phase
    return _DEALLOCATE(self)


def _unless_registers(check):
    def checked(self, thread, clock, buffer_key, *args, **kwargs):
        if buffer_key.memory_space_id != _REGS:
            check(self, thread, clock, buffer_key, *args, **kwargs)

    return checked


def _tma_load_written(self, tma_thread_id, shared_memory):
    if self.clock is not None:  # (the task's own copy of its issuer's clock)
        self.clock.commit_smem()
    return _TMA_LOAD_WRITTEN(self, tma_thread_id, shared_memory)


@contextlib.contextmanager
def interpret_mode(detect_races: bool = True):
    """Mosaic GPU kernels called inside run in interpret mode, with the additions above."""
    jaxpr_interpret.JaxprInterpreter.interpret = _interpret
    gpu_callbacks.copy_smem_to_gmem = _copy_smem_to_gmem
    memory.Barrier.deallocate = _deallocate_barrier
    gpu_callbacks.AsyncCopyGmemToSmemTask.post_read = _tma_load_written
    for name, check in _CHECKS.items():
        setattr(GPURaceDetectionState, name, _unless_registers(check))
    try:
        with plgpu.force_gpu_interpret_mode(plgpu.InterpretGPUParams(detect_races=detect_races)):
            yield
    finally:
        jaxpr_interpret.JaxprInterpreter.interpret = _INTERPRET
        gpu_callbacks.copy_smem_to_gmem = _COPY_SMEM_TO_GMEM
        memory.Barrier.deallocate = _DEALLOCATE
        gpu_callbacks.AsyncCopyGmemToSmemTask.post_read = _TMA_LOAD_WRITTEN
        for name, check in _CHECKS.items():
            setattr(GPURaceDetectionState, name, check)
        from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call

        interpret_pallas_call.reset_gpu_interpret_mode_state()


def check_in_fresh_process(test_file: str, cases) -> None:
    """`interpret_check(case)` of the test module `test_file` (a path) for each of `cases` (names), one after the
    other in a fresh Python process (its start, about 5 s, is most of a case's time), killed and started again if
    it hangs; a wrong number (AssertionError) or a race ("RACE DETECTED") fails at once.

    The interpreter runs each warpgroup as a thread whose barrier waits block inside XLA's CPU runtime, which
    runs them on a small thread pool (one thread per core): now and then (about one run in ten of
    `exp/bsa_gpu.py --cpu-smoke` on a 2-core machine, always in the same place, every thread waiting) the
    warpgroup that would release the others gets no thread. Such a hang says nothing about the kernels.
    """
    import pytest

    path = pathlib.Path(test_file).resolve()
    here = path.parent
    code = (
        f"import sys; sys.path[:0] = [{str(here)!r}, {str(here.parent)!r}]; import jax; "
        "jax.config.update('jax_disable_most_optimizations', True); "
        f"import harness; from {path.stem} import interpret_check\n"
        f"for case in {list(cases)!r}:\n    harness.reseed(case); interpret_check(case)"
    )
    for _ in range(3):
        try:
            run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
        except subprocess.TimeoutExpired:
            continue
        assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
        assert "RACE DETECTED" not in run.stdout, run.stdout[-4000:]
        return
    pytest.fail("interpret mode hung three times (see check_in_fresh_process)")
