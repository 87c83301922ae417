"""EnvPool: many sandboxed environments stepped concurrently.

Usage (the SPADE loop's view):

    pool = EnvPool(SandboxConfig(), warm=8, max_turns=25)
    first = pool.start(code, seed=7)                 # StepResult: observation, info, handle
    results = pool.step_many([(first.handle, "\\boxed{3}"), ...])   # in input order
    for r in pool.iter_step_many(pairs): ...         # or in completion order (exhaust it)
    pool.submit_steps(pairs); pool.collect_steps()   # or in the background, collected later
    pool.call(handle, "solution")                    # CallResult for solution()/hint()
    pool.close(handle); pool.shutdown()              # or `with EnvPool(...) as pool:`

Every environment lives in its own worker process (see `worker.py`); `start` takes a pre-started
worker from the warm pool, sends the code, instantiates the class and resets it. Results are
values, never exceptions: `status` is "ok", "crashed" (the environment raised, broke the
contract, exited or violated the protocol) or "timeout" (a call ran past its wall limit, or the
episode's calls together past `play_timeout_s`; the worker's process group was killed). A
crashed or timed-out episode is over: its worker is gone and further calls on the handle return
"crashed" at once. `call` also returns "error" when a
method raised but the worker is still alive. After `max_turns` steps a non-terminated episode
reports `truncated=True`, as gymnasium's TimeLimit does; with `game_turns` an environment is
built with its constructor's default `max_turns`, capped at `max_turns`, for its own
truncation.
"""

import collections
import dataclasses
import enum
import logging
import math
import os
import queue
import selectors
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from spade_jax.envs.contract import reset_problem, step_problem
from spade_jax.envs.sandbox.isolation import SandboxConfig
from spade_jax.envs.sandbox.probe import probe_layers
from spade_jax.envs.sandbox.process import ProtocolError, WorkerProcess

log = logging.getLogger(__name__)


class CallStatus(enum.StrEnum):
    """Outcome of one sandbox call (see the module docstring)."""

    OK = "ok"
    ERROR = "error"
    CRASHED = "crashed"
    TIMEOUT = "timeout"


OK, ERROR, CRASHED, TIMEOUT = CallStatus


@dataclasses.dataclass(frozen=True)
class StepResult:
    """Outcome of start/reset/step on one handle; `status` says whether the values are real."""

    handle: int
    status: str
    observation: str = ""
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict = dataclasses.field(default_factory=dict)
    error: str = ""
    output: str = ""

    @property
    def ok(self) -> bool:
        """True when the environment answered within the contract."""
        return self.status == OK

    @property
    def done(self) -> bool:
        """True when the episode is over for any reason (terminal, truncated, crashed, timeout)."""
        return self.terminated or self.truncated or not self.ok


@dataclasses.dataclass(frozen=True)
class CallResult:
    """Raw outcome of one worker request: the decoded value plus its type tags."""

    handle: int
    status: str
    value: Any = None
    kinds: Any = None
    is_tuple: bool = False
    error: str = ""
    error_kind: str = ""
    output: str = ""
    env_class: str = ""

    @property
    def ok(self) -> bool:
        """True when the request succeeded."""
        return self.status == OK


@dataclasses.dataclass
class _Episode:
    worker: WorkerProcess
    max_turns: int
    turns: int = 0
    ended: str = ""
    env_seconds: float = 0.0  # wall time its calls have taken (capped by play_timeout_s)


@dataclasses.dataclass
class _Job:
    handle: int
    episode: _Episode
    requests: list[dict]
    timeout_s: float
    sent: int = 0
    sent_at: float = 0.0
    deadline: float = math.inf
    replies: list[dict] = dataclasses.field(default_factory=list)
    status: str = ""
    error: str = ""


class EnvPool:
    """Owns the warm workers and the live episodes; see the module docstring for the API."""

    def __init__(self, config: SandboxConfig | None = None, *, warm: int = 4, max_turns: int = 25,
                 max_concurrent_calls: int | None = None, game_turns: bool = False):
        config = config or SandboxConfig()
        self.layers, self.config = probe_layers(config)
        self.warm_size = warm
        self.max_turns, self.game_turns = max_turns, game_turns
        self.max_concurrent_calls = max_concurrent_calls or 8 * (os.cpu_count() or 1)
        self._warm: collections.deque[WorkerProcess] = collections.deque()
        self._episodes: dict[int, _Episode] = {}
        self._next_handle = 0
        self._selector = selectors.DefaultSelector()  # one epoll for the pool's lifetime
        self._arrived: queue.SimpleQueue = queue.SimpleQueue()  # background steps' results
        self._submitted: dict[int, float] = {}  # handle of a background step -> when submitted
        self._in_flight: set[int] = set()  # handles a background thread is stepping
        self._close_after: set[int] = set()  # of those, closed: their thread kills the worker
        self._lock = threading.Lock()  # guards _in_flight and _close_after
        self._refill()

    # ----------------------------------------------------------------------------- public API
    def start(self, code: str, seed: int | None, *, max_turns: int | None = None) -> StepResult:
        """Load `code` in a fresh worker and reset it with `seed`; the result carries the handle."""
        return self.start_many([(code, seed)], max_turns=max_turns)[0]

    def start_many(self, specs: Iterable[tuple[str, int | None]], *,
                   max_turns: int | None = None) -> list[StepResult]:
        """Start several episodes concurrently; results in input order."""
        jobs = [self._new_job(code, max_turns, [_call("reset", seed=seed)]) for code, seed in specs]
        try:
            return [self._step_result(job) for job in self._ordered(jobs)]
        finally:
            self._refill()

    def open(self, code: str, *, max_turns: int | None = None) -> CallResult:
        """Load `code` and instantiate its class without resetting (used by load_env)."""
        job = self._new_job(code, max_turns, [])
        try:
            return self._call_result(self._ordered([job])[0])
        finally:
            self._refill()

    def reset(self, handle: int, seed: int | None) -> StepResult:
        """Reset a live episode in its current worker (the turn count restarts)."""
        job = self._job(handle, [_call("reset", seed=seed)])
        if job.episode is not None:
            job.episode.turns = 0
        return self._step_result(self._ordered([job])[0])

    def step(self, handle: int, action: str) -> StepResult:
        """Step one episode."""
        return self.step_many([(handle, action)])[0]

    def step_many(self, pairs: Sequence[tuple[int, str]]) -> list[StepResult]:
        """Step many episodes concurrently; results in input order."""
        jobs = [self._job(handle, [_call("step", str(action))]) for handle, action in pairs]
        return [self._step_result(job) for job in self._ordered(jobs)]

    def iter_step_many(self, pairs: Sequence[tuple[int, str]]) -> Iterator[StepResult]:
        """Step many episodes concurrently, yielding each result as soon as it arrives."""
        jobs = [self._job(handle, [_call("step", str(action))]) for handle, action in pairs]
        for job in self._run(jobs, self._selector):
            yield self._step_result(job)

    def submit_steps(self, pairs: Sequence[tuple[int, str]]) -> None:
        """Step these episodes in a background thread (its own epoll), so the caller works on
        while they run; `collect_steps` returns their results. Until then the episodes take
        no other call; closing one forgets its step (its thread kills the worker once the
        step returns)."""
        pairs = list(pairs)
        busy = sorted(h for h, _ in pairs if h in self._submitted)
        if busy or len({h for h, _ in pairs}) < len(pairs):
            raise ValueError(f"episodes {busy or pairs} already have a step submitted")
        jobs = [self._job(handle, [_call("step", str(action))]) for handle, action in pairs]
        now = time.monotonic()
        self._submitted.update((handle, now) for handle, _ in pairs)
        with self._lock:
            self._in_flight.update(job.handle for job in jobs if not job.status)
        if jobs:
            threading.Thread(target=self._step_in_background, args=(jobs,), daemon=True,
                             name="EnvPool.submit_steps").start()

    def collect_steps(self, *, fresh_s: float = 0.0, wait_s: float = 0.0) -> list[StepResult]:
        """Results of submitted steps that are back, in arrival order.

        Waits until every step submitted less than `fresh_s` seconds ago is back (a grace for
        quick steps), and, while none is back, up to `wait_s` seconds (math.inf: until one is).
        An exception in the background thread is raised here.
        """
        out: list[StepResult] = []
        patience = time.monotonic() + wait_s
        while self._submitted:
            deadline = max(t + fresh_s for t in self._submitted.values())
            if not out:
                deadline = max(deadline, patience)
            left = deadline - time.monotonic()
            try:
                if left > 0:
                    item = self._arrived.get(timeout=None if math.isinf(left) else left)
                else:
                    item = self._arrived.get_nowait()
            except queue.Empty:
                if left > 0:
                    continue
                break
            if isinstance(item, BaseException):
                raise item
            if self._submitted.pop(item.handle, None) is not None:  # else closed meanwhile
                out.append(item)
        return out

    @property
    def steps_outstanding(self) -> int:
        """Submitted steps whose results `collect_steps` has not returned yet."""
        return len(self._submitted)

    def call(self, handle: int, method: str, *args, **kwargs) -> CallResult:
        """Call an allowed method (solution, hint, get_tools, reset, step, close) and return raw."""
        job = self._job(handle, [_call(method, *args, **kwargs)])
        return self._call_result(self._ordered([job])[0])

    def close(self, handle: int) -> None:
        """End an episode and kill its worker (forgetting a step submitted for it); unknown or
        ended handles are ignored."""
        self._submitted.pop(handle, None)
        with self._lock:
            episode = self._episodes.pop(handle, None)
            if handle in self._in_flight:  # its thread still reads the worker's pipe
                self._close_after.add(handle)
                return
        if episode is not None:
            episode.worker.kill()

    def shutdown(self) -> None:
        """Kill every live and warm worker."""
        for handle in list(self._episodes):
            self.close(handle)
        while self._warm:
            self._warm.popleft().kill()
        self._selector.close()

    def __enter__(self) -> "EnvPool":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def __del__(self):
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ------------------------------------------------------------------------------ internals
    def _refill(self) -> None:
        while len(self._warm) < self.warm_size:
            self._warm.append(WorkerProcess(self.config))

    def _take_worker(self) -> WorkerProcess:
        while self._warm:
            worker = self._warm.popleft()
            if worker.proc.poll() is None:
                return worker
            worker.kill()
        return WorkerProcess(self.config)

    def _new_job(self, code: str, max_turns: int | None, then: list[dict]) -> _Job:
        turns = max_turns or self.max_turns
        episode = _Episode(self._take_worker(), turns)
        handle, self._next_handle = self._next_handle, self._next_handle + 1
        self._episodes[handle] = episode
        load = {"op": "load", "code": code, "max_turns": turns, "game_turns": self.game_turns}
        job = _Job(handle, episode, [load] + then, self.config.start_timeout_s)
        if len(code.encode()) > self.config.max_code_bytes:
            job.status, job.error = CRASHED, f"code exceeds {self.config.max_code_bytes} bytes"
        return job

    def _job(self, handle: int, requests: list[dict]) -> _Job:
        episode = self._episodes.get(handle)
        job = _Job(handle, episode, requests, self.config.step_timeout_s)
        if episode is None:
            job.status, job.error = CRASHED, f"unknown or closed handle {handle}"
        elif handle in self._submitted:  # until collected, as submit_steps says
            raise ValueError(f"episode {handle} has a step in the background: collect it first")
        elif episode.ended:
            job.status, job.error = CRASHED, f"episode already ended: {episode.ended}"
        return job

    def _ordered(self, jobs: list[_Job]) -> list[_Job]:
        finished = list(self._run(jobs, self._selector))
        assert len(finished) == len(jobs)
        return jobs

    def _send_next(self, job: _Job) -> None:
        try:
            job.episode.worker.send(job.requests[job.sent])
        except OSError as exc:
            self._fail(job, CRASHED, f"worker pipe closed: {exc}")
            return
        job.sent += 1
        job.sent_at = time.monotonic()
        left = self.config.play_timeout_s - job.episode.env_seconds
        job.deadline = job.sent_at + min(job.timeout_s, left)

    def _fail(self, job: _Job, status: str, error: str) -> None:
        job.status, job.error = status, error
        job.episode.ended = f"{status}: {error}"
        job.episode.worker.kill()

    def _pump(self, job: _Job) -> None:
        """Consume whatever the job's worker has written; sets job.status when it is finished."""
        worker = job.episode.worker
        try:
            replies, eof = worker.read_replies()
        except ProtocolError as exc:
            self._fail(job, CRASHED, f"protocol violation: {exc}")
            return
        for reply in replies:
            if not worker.ready:
                if not reply.get("ready"):
                    self._fail(job, CRASHED, "worker did not announce readiness")
                    return
                worker.ready = True
            else:
                job.episode.env_seconds += time.monotonic() - job.sent_at
                job.replies.append(reply)
                if not reply["ok"]:
                    job.status, job.error = ERROR, str(reply.get("error", ""))
                    return
            if job.sent < len(job.requests):
                self._send_next(job)
                if job.status:
                    return
            else:
                job.status = OK
                return
        if eof:
            code = worker.proc.poll()
            self._fail(job, CRASHED, f"worker exited (returncode {code}) during the call")

    def _step_in_background(self, jobs: list[_Job]) -> None:
        """`submit_steps`'s thread: drive the jobs on an epoll of its own, queueing each
        result (or the exception that stopped it) as it arrives."""
        try:
            with selectors.DefaultSelector() as selector:
                for job in self._run(jobs, selector):
                    result = self._step_result(job)
                    with self._lock:
                        self._in_flight.discard(job.handle)
                        closed = job.handle in self._close_after
                        self._close_after.discard(job.handle)
                    if closed:
                        job.episode.worker.kill()
                    else:
                        self._arrived.put(result)
        except BaseException as exc:  # noqa: BLE001 - re-raised by collect_steps
            self._arrived.put(exc)

    def _run(self, jobs: list[_Job], selector: selectors.BaseSelector) -> Iterator[_Job]:
        """Drive the jobs to completion on `selector`, at most max_concurrent_calls at a time."""
        pending = collections.deque(jobs)
        active: dict[int, _Job] = {}
        try:
            while pending or active:
                while pending and len(active) < self.max_concurrent_calls:
                    job = pending.popleft()
                    if not job.status:
                        worker = job.episode.worker
                        if worker.ready:
                            self._send_next(job)
                        else:
                            job.deadline = worker.spawned_at + self.config.start_timeout_s
                    if job.status:
                        yield job
                        continue
                    active[worker.fileno()] = job
                    selector.register(worker.fileno(), selectors.EVENT_READ)
                if not active:
                    continue
                wait = min(job.deadline for job in active.values()) - time.monotonic()
                events = selector.select(max(0.0, wait))
                for key, _ in events:
                    self._pump(active[key.fd])
                now = time.monotonic()
                for fd, job in list(active.items()):
                    if not job.status and now >= job.deadline:
                        self._fail(job, TIMEOUT, self._timeout_message(job, now))
                    if job.status:
                        selector.unregister(fd)
                        del active[fd]
                        yield job
        finally:
            for fd, job in active.items():  # abandoned by the consumer: the protocol is out of step
                selector.unregister(fd)
                self._fail(job, CRASHED, "call abandoned before its reply")

    def _timeout_message(self, job: _Job, now: float) -> str:
        """Which limit a timed-out call hit: its own, or the episode's play budget."""
        if job.episode.worker.ready and job.sent and (
                job.episode.env_seconds + now - job.sent_at >= self.config.play_timeout_s):
            return (f"the episode's environment calls took {self.config.play_timeout_s:g} s in "
                    "all (sandbox.play_timeout_s)")
        return f"no reply within {job.timeout_s:g} s"

    def _call_result(self, job: _Job) -> CallResult:
        reply = job.replies[-1] if job.replies else {}
        output = "".join(r.get("output", "") for r in job.replies)
        env_class = next((r["env_class"] for r in job.replies if "env_class" in r), "")
        if job.status != OK:
            return CallResult(job.handle, job.status, error=job.error,
                              error_kind=str(reply.get("kind", job.status)), output=output,
                              env_class=env_class)
        return CallResult(job.handle, OK, reply.get("value"), reply.get("kinds"),
                          bool(reply.get("is_tuple")), output=output, env_class=env_class)

    def _step_result(self, job: _Job) -> StepResult:
        result = self._call_result(job)
        is_reset = job.requests[-1].get("method") == "reset"
        problem = result.error if not result.ok else (reset_problem if is_reset else step_problem)(
            result.value, result.kinds, result.is_tuple)
        if problem:
            if job.episode is not None and not job.episode.ended:
                self._fail(job, CRASHED, problem)
            status = TIMEOUT if result.status == TIMEOUT else CRASHED
            return StepResult(job.handle, status, error=problem, output=result.output)
        if is_reset:
            return StepResult(job.handle, OK, result.value[0], info=result.value[1],
                              output=result.output)
        obs, reward, terminated, truncated, info = result.value
        job.episode.turns += 1
        out_of_turns = job.episode.turns >= job.episode.max_turns
        truncated = bool(truncated) or (not terminated and out_of_turns)
        return StepResult(job.handle, OK, obs, float(reward), bool(terminated), truncated, info,
                          output=result.output)


def _call(method: str, *args, **kwargs) -> dict:
    return {"op": "call", "method": method, "args": list(args), "kwargs": kwargs}
