import time


class SlowCounterEnv:
    """Counts turns to three; a seed of 1 makes every step take `SLOW_STEP_S` seconds."""

    SLOW_STEP_S = 1.0

    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.turn, self.slow = 0, seed == 1
        return f"Count to three (seed {seed}).", {}

    def step(self, action):
        if self.slow:
            time.sleep(self.SLOW_STEP_S)
        self.turn += 1
        done = self.turn >= 3
        return f"turn {self.turn} done; say the next number.", float(done), done, False, {}
