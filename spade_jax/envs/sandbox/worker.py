"""Sandbox worker: hosts one environment in its own process and serves JSON requests.

Run by the host as `python -s -B worker.py CONFIG_JSON` inside bubblewrap; stdlib only.
Start-up: keep private copies of the pipe fds the host gave as stdin/stdout, point fds 0-2 at
/dev/null (so the environment's prints can never be mistaken for protocol), import the
injected names, apply rlimits, install the seccomp filter, then write one `ready` line.
Then it serves one request per line and answers one reply per line:

    {"op": "load", "code": str, "max_turns": int}   -> {"ok": true, "env_class": str}
    {"op": "call", "method": str, "args": [...], "kwargs": {...}}
        -> {"ok": true, "value": <json>, "kinds": [...] | str, "is_tuple": bool}
    {"op": "close"}                                  -> {"ok": true}; the worker exits

A failed request answers {"ok": false, "kind": "exception"|"contract"|"oversize"|"protocol",
"error": str}. Every reply carries "output": what the environment printed (capped).
"""

import importlib.util
import io
import json
import os
import resource
import sys
import traceback

from injected import build_namespace

_CALLABLE_METHODS = {"reset", "step", "solution", "hint", "close", "get_tools",
                     "schema_problems", "reset_problems"}  # the last two: tool-use checks T1, T2
_RLIMITS = {
    "as": resource.RLIMIT_AS,
    "cpu": resource.RLIMIT_CPU,
    "fsize": resource.RLIMIT_FSIZE,
    "nofile": resource.RLIMIT_NOFILE,
    "core": resource.RLIMIT_CORE,
}


class CappedOutput(io.TextIOBase):
    """A text sink that keeps the first `cap` characters written and counts the rest."""

    def __init__(self, cap: int):
        self.cap, self.parts, self.kept, self.dropped = cap, [], 0, 0

    def write(self, text) -> int:
        text = str(text)
        room = self.cap - self.kept
        if room > 0:
            self.parts.append(text[:room])
            self.kept += min(room, len(text))
        self.dropped += max(0, len(text) - max(room, 0))
        return len(text)

    def take(self) -> str:
        out = "".join(self.parts)
        if self.dropped:
            out += f"\n[... {self.dropped} characters of output dropped]"
        self.parts, self.kept, self.dropped = [], 0, 0
        return out


def encode(value, depth: int = 0):
    """JSON-safe copy of an environment's return value (repr for foreign objects)."""
    if value is None or isinstance(value, (bool, str, float)):
        return value
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**63 else float(value)
    if depth > 32:
        return {"__repr__": "<nested too deep>"}
    if isinstance(value, (list, tuple)):
        return [encode(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {str(key): encode(item, depth + 1) for key, item in value.items()}
    if type(value).__module__ == "numpy" and hasattr(value, "item"):
        return encode(value.item(), depth + 1)
    return {"__repr__": repr(value)[:200]}


def kind_of(value) -> str:
    """Coarse type tag the host checks against the contract (bool before number)."""
    type_name = type(value).__name__
    if isinstance(value, bool) or type_name == "bool_":
        return "bool"
    if isinstance(value, (int, float)) or (
        type(value).__module__ == "numpy" and type_name.startswith(("int", "float", "uint"))
    ):
        return "number"
    for kind, types in (("str", str), ("dict", dict), ("none", type(None))):
        if isinstance(value, types):
            return kind
    return "sequence" if isinstance(value, (list, tuple)) else "other"


def apply_rlimits(limits: dict) -> list[str]:
    """Set each configured rlimit (soft = hard, CPU hard one second later); names applied."""
    applied = []
    for name, value in limits.items():
        hard = value + 1 if name == "cpu" else value
        resource.setrlimit(_RLIMITS[name], (value, hard))
        applied.append(name)
    return applied


def load_tool_use(namespace: dict, path: str | None) -> None:
    """Inject ToolUseEnv (alias ToolUseBaseEnv) from tool_use.py, loaded by path, if present."""
    if not path or not os.path.exists(path):
        return
    spec = importlib.util.spec_from_file_location("spade_jax_tool_use", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    namespace["ToolUseEnv"] = namespace["ToolUseBaseEnv"] = module.ToolUseEnv


class Worker:
    """State of one worker: the namespace, the environment instance and the reply channel."""

    def __init__(self, reply_fd: int, config: dict):
        self.reply_fd, self.config = reply_fd, config
        self.output = CappedOutput(config["output_cap"])
        self.namespace = build_namespace()
        self.injected = set(self.namespace)
        self.env = None

    def send(self, message: dict) -> None:
        message["output"] = self.output.take()
        data = json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode()
        if len(data) > self.config["reply_cap"]:
            data = json.dumps({
                "ok": False, "kind": "oversize",
                "error": f"reply of {len(data)} bytes exceeds the cap of "
                         f"{self.config['reply_cap']} bytes",
                "output": "",
            }).encode()
        view = memoryview(data + b"\n")
        while view:
            view = view[os.write(self.reply_fd, view):]

    def load(self, code: str, max_turns: int, game_turns: bool = False) -> dict:
        """Instantiate the code's one *Env class with `max_turns`; with `game_turns`, with its
        own default `max_turns` capped at `max_turns` (the reference's respect_game_max_turns:
        a game that truncates itself at its own limit keeps its designed pacing)."""
        exec(compile(code, "<designer_env>", "exec"), self.namespace)
        classes = sorted(
            name for name, value in self.namespace.items()
            if isinstance(value, type) and name.endswith("Env") and name not in self.injected
            and value.__module__ == "designer_env"
        )
        if len(classes) != 1:
            return {"ok": False, "kind": "contract",
                    "error": f"expected exactly one top-level *Env class, found {classes}"}
        cls = self.namespace[classes[0]]
        with_limit, bare = {"max_turns": max_turns}, {}  # a design may take no argument
        first, second = (bare, with_limit) if game_turns else (with_limit, bare)
        try:
            self.env, given = cls(**first), first
        except TypeError:
            self.env, given = cls(**second), second
        if game_turns:  # the game's own limit, capped
            own = getattr(self.env, "max_turns", None)
            self.env.max_turns = min(own, max_turns) if type(own) is int and own > 0 else max_turns
        elif not given:
            self.env.max_turns = max_turns
        return {"ok": True, "env_class": classes[0]}

    def call(self, method: str, args: list, kwargs: dict) -> dict:
        if self.env is None:
            return {"ok": False, "kind": "protocol", "error": "no environment loaded"}
        if method not in _CALLABLE_METHODS:
            return {"ok": False, "kind": "protocol", "error": f"method {method!r} not allowed"}
        function = getattr(self.env, method, None)
        if not callable(function):
            return {"ok": False, "kind": "contract", "error": f"environment has no {method}()"}
        value = function(*args, **kwargs)
        is_tuple = isinstance(value, (tuple, list))
        kinds = [kind_of(item) for item in value] if is_tuple else kind_of(value)
        return {"ok": True, "value": encode(value), "kinds": kinds, "is_tuple": is_tuple}

    def handle(self, line: bytes) -> bool:
        """Serve one request line; False when the worker should exit."""
        sys.stdout = sys.stderr = self.output
        try:
            request = json.loads(line)
            op = request["op"]
            if op == "load":
                reply = self.load(request["code"], request["max_turns"],
                                  bool(request.get("game_turns")))
            elif op == "call":
                reply = self.call(
                    request["method"], request.get("args", []), request.get("kwargs", {})
                )
            elif op == "close":
                if self.env is not None and callable(getattr(self.env, "close", None)):
                    self.env.close()
                self.send({"ok": True})
                return False
            else:
                reply = {"ok": False, "kind": "protocol", "error": f"unknown op {op!r}"}
        except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt included
            text = "".join(traceback.format_exception(exc, limit=-8))
            reply = {"ok": False, "kind": "exception", "error": text[-4000:]}
        self.send(reply)
        return True


def main() -> None:
    """Set up the layers, announce readiness, then serve requests until close or EOF."""
    config = json.loads(sys.argv[1])
    request_fd, reply_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    worker = Worker(reply_fd, config)
    load_tool_use(worker.namespace, config.get("tool_use_path"))
    worker.injected = set(worker.namespace)
    layers = {"rlimits": apply_rlimits(config["rlimits"]), "seccomp": False}
    if config["seccomp"]:
        import seccomp_filter

        seccomp_filter.install()
        layers["seccomp"] = True
    worker.send({"ok": True, "ready": True, "layers": layers, "uid": os.getuid()})
    requests = os.fdopen(request_fd, "rb")
    for line in requests:
        if not worker.handle(line):
            break
    os._exit(0)


if __name__ == "__main__":
    main()
