"""An in-process stand-in for `envs.EnvPool`, for tests of env runners with scripted actions."""

from spade_jax.envs import StepResult


class LocalPool:
    """EnvPool's start/step/close over `make_local` environments (trusted scripted actions)."""

    def __init__(self, tasks):
        self.tasks = {task.code: task for task in tasks}
        self.envs = {}

    def start_many(self, specs, max_turns=None):
        results = []
        for code, seed in specs:
            handle = len(self.envs)
            self.envs[handle] = self.tasks[code].make_local()
            observation, info = self.envs[handle].reset(seed=seed)
            results.append(StepResult(handle, "ok", observation, info=info))
        return results

    def step_many(self, pairs):
        return [StepResult(h, "ok", *self.envs[h].step(a)) for h, a in pairs]

    def close(self, handle):
        self.envs.pop(handle)
