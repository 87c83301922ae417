"""Shared fixtures for the environment tests: one sandbox pool, case files, small helpers."""

import pathlib

import pytest

from spade_jax.envs.sandbox import EnvPool, SandboxConfig

CASES = pathlib.Path(__file__).parent / "cases"
TEST_CONFIG = SandboxConfig(step_timeout_s=3.0, start_timeout_s=30.0)


def case(name: str) -> str:
    """Source text of tests/envs/cases/<name>.py."""
    return (CASES / f"{name}.py").read_text()


@pytest.fixture(scope="session")
def pool():
    """A sandbox pool shared by the environment tests (short call timeout)."""
    with EnvPool(TEST_CONFIG, warm=4, max_turns=25) as shared:
        yield shared


def assert_pool_usable(pool: EnvPool) -> None:
    """The pool still starts and steps a good environment."""
    start = pool.start(case("good_guess"), seed=3)
    assert start.ok, start
    step = pool.step(start.handle, "\\boxed{500}")
    assert step.ok and "wrong" in step.observation or step.reward == 1.0, step
    pool.close(start.handle)
