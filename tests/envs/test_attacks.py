"""Attack suite: hostile environment code loaded straight into the sandbox (no lint).

Each attack runs inside `step`; the test checks that it was contained (the host is unchanged,
the secret is not visible, the call came back as a result) and that the pool still works.
"""

import os
import textwrap
import uuid

import pytest

from spade_jax.envs.sandbox import EnvPool
from tests.envs.conftest import TEST_CONFIG, assert_pool_usable

TEMPLATE = """
import os, sys, signal, socket, subprocess
class AttackEnv:
    def __init__(self, max_turns=25):
        pass
    def reset(self, seed=None):
        return "ready", {{}}
    def step(self, action):
        result = "not run"
{body}
        return str(result), 0.0, True, False, {{}}
"""


def attack(body: str) -> str:
    """Environment source whose step() runs `body` (which may set `result`)."""
    return TEMPLATE.format(body=textwrap.indent(textwrap.dedent(body), " " * 8))


def run_attack(pool: EnvPool, body: str):
    start = pool.start(attack(body), seed=0)
    assert start.ok, start
    result = pool.step(start.handle, "go")
    pool.close(start.handle)
    assert_pool_usable(pool)
    return result


def guarded(expr: str) -> str:
    return f"try:\n    result = 'SUCCEEDED ' + repr({expr})\nexcept BaseException as e:\n    result = 'blocked ' + repr(e)\n"  # noqa: E501


def test_network_connect_is_blocked(pool):
    r = run_attack(pool, guarded("socket.create_connection(('1.1.1.1', 80), timeout=2)"))
    assert r.ok and r.observation.startswith("blocked")
    r = run_attack(pool, guarded("socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)"))
    assert r.ok and r.observation.startswith("blocked")


@pytest.mark.parametrize("directory", ["/tmp", "/etc"])
def test_writes_outside_the_sandbox_do_not_reach_the_host(pool, directory):
    path = f"{directory}/spade_canary_{uuid.uuid4().hex}"
    r = run_attack(pool, guarded(f"open({path!r}, 'w').write('pwned')"))
    assert r.ok and not os.path.exists(path)


def test_read_shadow_is_blocked(pool):
    r = run_attack(pool, guarded("open('/etc/shadow').read()"))
    assert r.ok and r.observation.startswith("blocked") and "root:" not in r.observation


def test_parent_environment_is_invisible(monkeypatch):
    secret = f"s3cret-{uuid.uuid4().hex}"
    monkeypatch.setenv("SPADE_TEST_SECRET", secret)
    body = """
    seen = [repr(dict(os.environ))]
    for pid in ["self", "1", str(os.getppid())]:
        try:
            seen.append(open(f"/proc/{pid}/environ").read())
        except BaseException as e:
            seen.append(repr(e))
    result = " | ".join(seen)
    """
    with EnvPool(TEST_CONFIG, warm=1) as fresh:
        r = run_attack(fresh, body)
    assert r.ok and secret not in r.observation and "SPADE_TEST_SECRET" not in r.observation


@pytest.mark.parametrize("expr", [
    "os.fork()",
    "subprocess.run(['id'], capture_output=True)",
    "os.system('id')",
    "os.execv('/usr/bin/id', ['id'])",
])
def test_process_creation_is_blocked(pool, expr):
    r = run_attack(pool, guarded(expr))
    # os.system reports a failed spawn as exit status 127 (32512), never running the shell
    assert r.ok and (r.observation.startswith("blocked") or "SUCCEEDED 32512" in r.observation)


def test_fork_bomb_is_contained(pool):
    r = run_attack(pool, "try:\n    while True:\n        os.fork()\nexcept OSError as e:\n    result = repr(e)\n")  # noqa: E501
    assert r.ok and "PermissionError" in r.observation


def test_huge_allocation_fails_inside(pool):
    r = run_attack(pool, guarded("len(bytearray(16 << 30))"))
    assert r.ok and "MemoryError" in r.observation


def test_infinite_loop_times_out(pool):
    r = run_attack(pool, "signal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass\n")
    assert r.status == "timeout" and r.done


def test_recursion_bombs_are_contained(pool):
    r = run_attack(pool, "def f(n):\n    return f(n + 1)\nresult = f(0)\n")
    assert r.status == "crashed" and "RecursionError" in r.error
    r = run_attack(pool, "sys.setrecursionlimit(10**9)\ndef f(n):\n    return f(n + 1)\nresult = f(0)\n")  # noqa: E501
    assert r.status in ("crashed", "timeout")  # MemoryError on the heap, or the wall limit


def test_flooding_stdout_is_capped(pool):
    body = "for _ in range(100):\n    print('x' * 1_000_000)\nos.write(1, b'y' * 10_000_000)\nresult = 'done'\n"  # noqa: E501
    r = run_attack(pool, body)
    assert r.ok and r.observation == "done" and len(r.output) < 20_000


def test_fake_protocol_lines_are_ignored(pool):
    fake = ('{"ok":true,"value":["pwned",1.0,true,false,{}],'
            '"kinds":["str","number","bool","bool","dict"],"is_tuple":true}')
    body = f"print({fake!r})\nsys.__stdout__.write({fake!r} + '\\n')\nos.write(1, {fake!r}.encode() + b'\\n')\nresult = 'real'\n"  # noqa: E501
    r = run_attack(pool, body)
    assert r.ok and r.observation == "real" and r.reward == 0.0


def test_garbage_on_the_private_pipe_crashes_only_that_episode(pool):
    body = "for fd in range(3, 12):\n    try:\n        os.write(fd, b'garbage\\n')\n    except OSError:\n        pass\n"  # noqa: E501
    r = run_attack(pool, body)
    assert r.status in ("crashed", "ok")


def test_exit_mid_step_is_a_crash(pool):
    r = run_attack(pool, "os._exit(0)\n")
    assert r.status == "crashed" and "exited" in r.error
    r = run_attack(pool, "sys.exit(3)\n")
    assert r.status == "crashed" and "SystemExit" in r.error


def test_signal_tricks_are_blocked(pool):
    body = """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    out = []
    for pid in (os.getppid(), 1, -1):
        try:
            os.kill(pid, signal.SIGKILL)
            out.append("killed")
        except OSError as e:
            out.append(type(e).__name__)
    result = ",".join(out)
    """
    r = run_attack(pool, body)
    assert r.ok and "killed" not in r.observation


def test_dunder_escape_reaches_nothing_useful(pool):
    canary = f"/tmp/spade_canary_{uuid.uuid4().hex}"
    body = f"""
    subclasses = ().__class__.__base__.__subclasses__()
    wrap = [c for c in subclasses if c.__name__ == "_wrap_close"][0]
    system = wrap.__init__.__globals__["system"]
    result = "system returned " + repr(system("touch {canary}"))
    """
    r = run_attack(pool, body)
    assert r.ok and not os.path.exists(canary)
    assert "returned 0" not in r.observation
