"""Host side of one worker process: spawn, send a request, collect reply lines, kill.

Replies are read without blocking (the pool multiplexes many workers with `selectors`);
a reply line longer than the cap, or bytes that are not a JSON object, are protocol
violations the caller turns into a crashed episode. Nothing from the worker is unpickled.
"""

import json
import os
import signal
import subprocess
import time

from spade_jax.envs.sandbox.isolation import SandboxConfig, worker_command, worker_env


class ProtocolError(RuntimeError):
    """The worker sent something that is not a well-formed reply."""


class WorkerProcess:
    """One sandboxed worker; `ready` becomes True once its start-up line has been read."""

    def __init__(self, config: SandboxConfig):
        self.config = config
        self.spawned_at = time.perf_counter()
        self.proc = subprocess.Popen(
            worker_command(config), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=worker_env(config), start_new_session=True,
            close_fds=True, bufsize=0,
        )
        self.request_fd = self.proc.stdin.fileno()
        self.reply_fd = self.proc.stdout.fileno()
        os.set_blocking(self.reply_fd, False)
        self.buffer = bytearray()
        self.ready = False
        self.dead = False

    def fileno(self) -> int:
        """The reply pipe, for selectors."""
        return self.reply_fd

    def send(self, request: dict) -> None:
        """Write one request line (blocking; the worker is idle and reading when this is called)."""
        data = json.dumps(request, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"
        view = memoryview(data)
        while view:
            view = view[os.write(self.request_fd, view):]

    def read_replies(self) -> tuple[list[dict], bool]:
        """Drain the pipe: (complete replies parsed so far, whether the worker hung up)."""
        eof = False
        while True:
            try:
                chunk = os.read(self.reply_fd, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                eof = True
                break
            self.buffer += chunk
            if len(self.buffer) > self.config.reply_cap_bytes + 4096 and b"\n" not in self.buffer:
                raise ProtocolError(f"reply exceeds {self.config.reply_cap_bytes} bytes")
        replies = []
        while (end := self.buffer.find(b"\n")) >= 0:
            line = bytes(self.buffer[:end])
            del self.buffer[: end + 1]
            try:
                reply = json.loads(line)
            except ValueError as exc:
                raise ProtocolError(f"reply is not JSON: {line[:80]!r}") from exc
            if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
                raise ProtocolError(f"reply is not a JSON object with 'ok': {line[:80]!r}")
            replies.append(reply)
        return replies, eof

    def kill(self) -> None:
        """SIGKILL the worker's whole process group (bwrap and everything under it) and reap it."""
        if self.dead:
            return
        self.dead = True
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
