"""Checking and timing on the GPU in a child process that is replaced when a variant kills it."""
from __future__ import annotations

import multiprocessing as mp
import os
import traceback
from dataclasses import dataclass, replace

from dwgen.problem import Problem, other_activation
from dwgen.result import Result
from dwgen.space import Variant

# How long one call of the worker may take (checking and timing one candidate, or re-timing the finalists)
# before the worker is killed, the candidate recorded as a timeout and a fresh worker started.
RUN_TIMEOUT_S = 180.0


@dataclass(frozen=True)
class Candidate:
    """A variant and the library that holds its kernel and launch function (a test may hand in any library)."""

    variant: Variant
    library: str


class Launcher:
    """A variant's loaded library and its launch on any problem of its signature; unload() after the last launch."""

    def __init__(self, cand: Candidate):
        from dwgen import contract
        from dwgen.driver import Library

        self.variant = cand.variant
        self.lib = Library(cand.library, contract.launch_symbol(cand.variant.name))

    def prepare(self, q: Problem, x, w, b, y):
        """One launch on problem q's tensors, through the variant's own launch function: call it to launch.
        The left padding is P; the right one is in Lout; q's activation is act."""
        return self.lib.prepare(x, w, b, y, q.batch, q.channels, q.length, q.out_length, q.padding, q.activation_arg)

    def unload(self) -> None:
        self.lib.unload()


class BwdLauncher:
    """A backward variant's loaded library: its launch (grad_x with per-tile partial sums, then the fixed-order
    sum of those into grad_weight and grad_bias; or one kernel for all three where a variant's block covers
    the whole batch) with the scratch that launch needs (none then)."""

    def __init__(self, cand: Candidate):
        from dwgen import contract
        from dwgen.driver import Library

        self.variant = cand.variant
        self.lib = Library(cand.library, contract.launch_symbol(cand.variant.name), contract.kinds("bwd"))
        self._workspace = contract.workspace_symbol(cand.variant.name)

    def prepare(self, q: Problem, gy, x, w, b, gx, gw, gb):
        """One launch on problem q's tensors (its left padding, Lout and activation), with a scratch of its own
        (not zeroed: the kernels need none)."""
        import torch

        floats = self.lib.workspace(self._workspace, q.batch, q.channels, q.length, q.out_length, q.padding)
        work = torch.empty(max(1, floats), device=x.device, dtype=torch.float32)
        return self.lib.prepare(gy, x, w, b, gx, gw, gb, work, q.batch, q.channels, q.length, q.out_length,
                                q.padding, q.activation_arg)

    def unload(self) -> None:
        self.lib.unload()


# ---- child side -------------------------------------------------------------------------------------


class _BenchBase:
    """The child's state for one problem's variants of a direction: the timer and the baselines, and how a
    candidate is checked and timed; the directions say what a launch, a check and PyTorch's side are."""

    def __init__(self, problem: Problem):
        import torch

        from dwgen import bench

        torch.cuda.init()
        self.problem = problem
        self.timer = bench.Timer(flush=bench.needs_flush(problem))
        self._baselines: dict | None = None

    # What a direction defines.
    def launcher(self, cand: Candidate):
        raise NotImplementedError

    def torch_operands(self):
        """PyTorch's side of the comparison, ready to time."""
        raise NotImplementedError

    def checks(self, launcher, edges: bool = True):
        """The correctness outcomes of a candidate on the problem and (with `edges`) its edge problems."""
        raise NotImplementedError

    def stream_check(self, launcher):
        raise NotImplementedError

    def timed(self, launcher):
        """The candidate's launch on the problem's timing operands and outputs of its own."""
        raise NotImplementedError

    def baselines(self) -> dict:
        from dwgen import bench

        if self._baselines is None:
            copy = self.timer.time(bench.copy_operands(self.problem))
            eager = self.timer.time(self.torch_operands())
            self._baselines = {"copy_ms": copy.median_ms, "torch_ms": eager.median_ms}
        return self._baselines

    def evaluate(self, cand: Candidate, edges: bool = True, timed: bool = True) -> dict:
        """Checked on the problem (and its edge problems unless `edges` is off: a search that checked them on
        another shape of the same build), then timed unless `timed` is off (a caller that re-times
        interleaved)."""
        import torch

        launcher = self.launcher(cand)
        try:
            worst = 0.0
            for outcome in self.checks(launcher, edges):
                if not outcome.ok:
                    return {"status": "wrong", "message": outcome.message, "max_rel_error": outcome.max_rel_error}
                worst = max(worst, outcome.max_rel_error)
            outcome = self.stream_check(launcher)
            if not outcome.ok:
                return {"status": "wrong", "message": outcome.message, "max_rel_error": outcome.max_rel_error}
            if not timed:
                return {"status": "ok", "max_rel_error": worst}
            t = self.timer.time(self.timed(launcher))
        finally:
            torch.cuda.synchronize()  # the module must outlive its last launch
            launcher.unload()
        return {"status": "ok", "kernel_ms": t.median_ms, "reps": t.reps, "max_rel_error": worst,
                **self.baselines()}

    def retime(self, cands: list[Candidate], rounds: int) -> dict:
        """Re-time the finalists interleaved with copy_ and PyTorch; returns medians by name."""
        import torch

        from dwgen import bench

        fns = {"copy_": bench.copy_operands(self.problem), "torch": self.torch_operands()}
        launchers = []
        try:
            for c in cands:
                launchers.append(self.launcher(c))
                fns[c.variant.name] = self.timed(launchers[-1])  # a launch keeps its tensors alive
            timings = self.timer.time_interleaved(fns, rounds)
        finally:
            torch.cuda.synchronize()
            for launcher in launchers:
                launcher.unload()
        return {k: t.median_ms for k, t in timings.items()}


class _Bench(_BenchBase):
    """Forward variants: check.check on the problem and its edge problems, check.check_stream, then timed
    beside copy_ of the same bytes and PyTorch's forward."""

    def __init__(self, problem: Problem):
        from dwgen import check

        super().__init__(problem)
        self.refs = check.ReferenceCache()

    def launcher(self, cand: Candidate) -> Launcher:
        return Launcher(cand)

    def torch_operands(self):
        from dwgen import bench

        x, w, b, _, _ = self.refs.get(self.problem, 0)
        return bench.torch_operands(self.problem, x, w, b)

    @staticmethod
    def _run(launcher: Launcher):
        def run(q, x, w, b, y):
            launcher.prepare(q, x, w, b, y)()
        return run

    def checks(self, launcher: Launcher, edges: bool = True):
        from dwgen import check

        for q in [self.problem, *(launcher.variant.edge_problems() if edges else ())]:
            yield check.check(q, self._run(launcher), cache=self.refs)

    def stream_check(self, launcher: Launcher):
        from dwgen import check

        return check.check_stream(self.problem, self._run(launcher), cache=self.refs)

    def timed(self, launcher: Launcher):
        from dwgen import check

        x, w, b, _, _ = self.refs.get(self.problem, 0)
        return launcher.prepare(self.problem, x, w, b, check.empty_output(self.problem))


class _BwdBench(_BenchBase):
    """Backward variants: check.check_backward (grad_x, grad_weight and grad_bias against float64 autograd,
    outputs NaN-filled) on the problem and the family's edge problems, with the problem's activation and with
    the other one where the family serves it (one launch function serves both), and
    check.check_backward_stream; then the whole launch is timed beside copy_ of the forward's bytes (the
    ratio the benchmark's backward rows give) and PyTorch's backward (autograd.grad through a retained graph)."""

    SEEDS = (0, 1)  # with the problem's activation
    OTHER_SEEDS = (2,)  # with the other one: one seed
    refs = None  # the float64 gradients of the checks, kept across candidates (__init__ makes the cache)

    def __init__(self, problem: Problem):
        from dwgen import check

        super().__init__(problem)
        self._operands = None
        self.refs = check.BackwardReferenceCache()

    def operands(self) -> tuple:
        """x, w, b and grad_out of the problem (seed 0), the inputs every timed launch reads."""
        from dwgen import check

        if self._operands is None:
            x, w, b = check.make_inputs(self.problem, 0)
            self._operands = (x, w, b, check.grad_output(self.problem, 0, x.device))
        return self._operands

    def outputs(self) -> tuple:
        """Fresh grad_x (empty_like keeps x's layout), grad_weight and grad_bias for one launcher to write."""
        import torch

        x, w, _, _ = self.operands()
        return torch.empty_like(x), torch.empty_like(w), torch.empty(w.shape[0], device=x.device, dtype=x.dtype)

    def launcher(self, cand: Candidate) -> BwdLauncher:
        return BwdLauncher(cand)

    def torch_operands(self):
        from dwgen import bench

        x, w, b, gy = self.operands()
        return bench.torch_backward_operands(self.problem, x, w, b, gy)

    def checks(self, launcher: BwdLauncher, edges: bool = True):
        from dwgen import check

        def run(q, x, w, b, gy, gx, gw, gb):
            launcher.prepare(q, gy, x, w, b, gx, gw, gb)()

        # what the launch takes for q's own padding: a narrow generic kernel is built on a stand-in of its scope
        # (the lane backward's is causal, SiLU included) and measured on centred calls, which take no SiLU
        family = launcher.variant.family
        for q in [self.problem, *(launcher.variant.edge_problems() if edges else ())]:
            yield check.check_backward(q, run, seeds=self.SEEDS, cache=self.refs)
            if other_activation(q) in family.activations(q):
                yield check.check_backward(replace(q, activation=other_activation(q)), run, seeds=self.OTHER_SEEDS,
                                           cache=self.refs)

    def stream_check(self, launcher: BwdLauncher):
        from dwgen import check

        return check.check_backward_stream(self.problem, lambda q, x, w, b, gy, gx, gw, gb: launcher.prepare(
            q, gy, x, w, b, gx, gw, gb)(), cache=self.refs)

    def timed(self, launcher: BwdLauncher):
        x, w, b, gy = self.operands()
        return launcher.prepare(self.problem, gy, x, w, b, *self.outputs())


def machine_info() -> dict:
    """Where a number was measured: GPU, capability, driver, torch and CUDA versions, date."""
    import datetime
    import shutil
    import subprocess

    import torch

    props = torch.cuda.get_device_properties(0)
    driver = ""
    if shutil.which("nvidia-smi"):
        q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"],
                           capture_output=True, text=True)
        driver = q.stdout.strip()
    return {
        "gpu": props.name,
        "capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "driver": driver,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": datetime.date.today().isoformat(),
    }


def _serve(conn, problem: Problem, direction: str = "fwd") -> None:
    bench_for = _Bench if direction == "fwd" else _BwdBench
    try:
        bench = bench_for(problem)
    except Exception:
        conn.send(("fatal", traceback.format_exc()))
        return
    conn.send(("ready", ""))
    while True:
        try:
            op, arg = conn.recv()
        except EOFError:
            return
        try:
            if op == "evaluate":
                reply = ("ok", bench.evaluate(arg))
            elif op == "check":
                cand, edges = arg
                reply = ("ok", bench.evaluate(cand, edges=edges, timed=False))
            elif op == "problem":  # another problem of the direction: its own references, timer and baselines
                bench = None  # the old problem's tensors go before the new ones are made
                bench = bench_for(arg)
                reply = ("ok", None)
            elif op == "baselines":
                reply = ("ok", bench.baselines())
            elif op == "machine":
                reply = ("ok", machine_info())
            elif op == "retime":
                reply = ("ok", bench.retime(*arg))
            elif op == "stop":
                return
            else:
                reply = ("error", f"unknown op {op}")
        except Exception as e:  # a CUDA error poisons this context: report it, then die and be replaced
            conn.send(("dead", f"{type(e).__name__}: {e}"))
            conn.close()
            os._exit(3)
        conn.send(reply)


# ---- parent side ------------------------------------------------------------------------------------


class WorkerDied(RuntimeError):
    """The worker process is gone; `status` says how the candidate it was on is recorded."""

    def __init__(self, message: str, status: str = "crashed"):
        super().__init__(message)
        self.status = status


class GpuWorker:
    """Runs evaluations in a spawned child; a crash, hang or CUDA error costs one variant, not the search."""

    direction = "fwd"  # whose variants the child checks and times

    def __init__(self, problem: Problem, timeout_s: float = RUN_TIMEOUT_S):
        self.problem, self.timeout_s = problem, timeout_s
        self._ctx = mp.get_context("spawn")
        self._proc = None
        self._conn = None
        self.starts = 0

    @property
    def restarts(self) -> int:
        """Workers started to replace one that died, hung or was poisoned."""
        return max(0, self.starts - 1)

    def _start(self) -> None:
        parent, child = self._ctx.Pipe()
        self._proc = self._ctx.Process(target=_serve, args=(child, self.problem, self.direction), daemon=True)
        self._proc.start()
        self.starts += 1
        child.close()
        self._conn = parent
        status, msg = self._recv(600.0)
        if status != "ready":
            raise RuntimeError(f"GPU worker failed to start: {msg}")

    def _recv(self, timeout: float):
        if not self._conn.poll(timeout):
            self._kill()
            raise WorkerDied(f"run timeout: no answer within {timeout:g} s (a kernel that never ends?); the worker "
                             "was killed", status="timeout")
        try:
            return self._conn.recv()
        except (EOFError, OSError) as e:
            self._proc.join(5)
            code = self._proc.exitcode
            self._kill()
            raise WorkerDied(f"worker process died (exit code {code})") from e

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(10)
        self._proc = self._conn = None

    def call(self, op: str, arg=None):
        if self._proc is None or not self._proc.is_alive():
            self._start()
        try:
            self._conn.send((op, arg))
        except (BrokenPipeError, OSError) as e:
            self._kill()
            raise WorkerDied("worker process was gone") from e
        status, payload = self._recv(self.timeout_s)
        if status == "dead":
            self._kill()
            raise WorkerDied(payload, status="launch_error" if payload.startswith("CudaLaunchError") else "crashed")
        if status != "ok":
            raise RuntimeError(payload)
        return payload

    def evaluate(self, cand: Candidate, base: Result) -> Result:
        """Check, then time one built candidate; `base` carries its name, digest and build facts."""
        try:
            out = self.call("evaluate", cand)
        except WorkerDied as e:
            return base.with_(status=e.status, message=str(e))
        return base.with_(**out)

    def check(self, cand: Candidate, base: Result, edges: bool = True) -> Result:
        """evaluate's checks alone (the problem's, the edge problems' unless `edges` is off, the stream's): for
        a caller that re-times the candidates that pass interleaved. kernel_ms stays unset."""
        try:
            out = self.call("check", (cand, edges))
        except WorkerDied as e:
            return base.with_(status=e.status, message=str(e))
        return base.with_(**out)

    def switch(self, problem: Problem) -> None:
        """Serve another problem of this direction from the same child: starting one (a process, torch's
        import, a CUDA context) costs seconds, which a search over many shapes would pay at each."""
        if problem == self.problem:
            return
        self.problem = problem
        if self._proc is not None and self._proc.is_alive():
            try:
                self.call("problem", problem)
            except WorkerDied:
                pass  # gone: the next call starts a child on the new problem

    def baselines(self) -> dict:
        return self.call("baselines")

    def machine(self) -> dict:
        return self.call("machine")

    def retime(self, cands: list[Candidate], rounds: int = 50) -> dict:
        return self.call("retime", (cands, rounds))

    def close(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(("stop", None))
                self._proc.join(10)
            except (BrokenPipeError, OSError):
                pass
        self._kill()


class BwdGpuWorker(GpuWorker):
    """The same worker for backward variants: each checked with check.check_backward, timed as its whole launch."""

    direction = "bwd"
