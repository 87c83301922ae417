"""Number machine: press operation buttons to turn the start value into the target.

Skill: Mathematical_Reasoning
Each press changes the value; the press budget is the shortest solution plus one.
"""
import random
import re
from collections import deque

BOX = re.compile(r"\\boxed\{([^{}]*)\}")
LIMIT = 500


class NumberMachineEnv:
    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def _apply(self, value, op):
        kind, k = op
        if kind == "+":
            out = value + k
        elif kind == "-":
            out = value - k
        elif kind == "*":
            out = value * k
        else:
            out = value // k
        return out if 0 <= out <= LIMIT else None

    def _shortest(self, start):
        prev = {start: None}
        queue = deque([start])
        while queue:
            v = queue.popleft()
            for name, op in self.buttons.items():
                w = self._apply(v, op)
                if w is not None and w not in prev:
                    prev[w] = (v, name)
                    queue.append(w)
        return prev

    def _one_button_wins(self, presses):
        for op in self.buttons.values():
            v = self.start
            for _ in range(presses):
                v = self._apply(v, op) if v is not None else None
                if v == self.target:
                    return True
        return False

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:
            self.buttons = {"A": ("+", rng.randint(2, 9)), "B": ("*", rng.randint(2, 4)),
                            "C": ("-", rng.randint(2, 9)), "D": ("/", rng.randint(2, 3))}
            self.start = rng.randint(2, 15)
            prev = self._shortest(self.start)
            paths = {}
            for v in prev:
                path, w = [], v
                while prev[w] is not None:
                    w, name = prev[w]
                    path.append(name)
                paths[v] = path[::-1]
            pool = sorted(v for v, p in paths.items() if len(p) in (4, 5))
            if pool:
                self.target = rng.choice(pool)
                self.plan = paths[self.target]
                if not self._one_button_wins(len(self.plan) + 1):
                    break
        self.value = self.start
        self.presses_left = len(self.plan) + 1
        self.turn = 0
        self.done = False
        rules = ("NUMBER MACHINE. The display shows a value. Each button applies an operation "
                 "(/ is integer division, rounding down). Values must stay between 0 and "
                 f"{LIMIT}. Reach the target exactly before your presses run out. Press a button "
                 "with \\boxed{A}, \\boxed{B}, \\boxed{C} or \\boxed{D}.")
        return rules + "\n" + self._status(), {}

    def _status(self):
        ops = ", ".join(f"{n} = {k}{v}" for n, (k, v) in self.buttons.items())
        return (f"Value: {self.value}. Target: {self.target}. Buttons: {ops}. "
                f"Presses left: {self.presses_left}.")

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        found = BOX.findall(str(action))
        name = found[-1].strip().upper() if found else ""
        if name not in self.buttons:
            return self._end("Press a button: \\boxed{A}, \\boxed{B}, \\boxed{C} or \\boxed{D}.\n"
                             + self._status(), 0.0, False)
        out = self._apply(self.value, self.buttons[name])
        self.presses_left -= 1
        if out is None:
            msg = f"Button {name} would leave the range 0..{LIMIT}; the press is wasted."
        else:
            msg = f"Button {name}: {self.value} -> {out}."
            self.value = out
        if self.value == self.target:
            return self._end(msg + " Target reached! You win.", 1.0, True)
        if self.presses_left <= 0:
            return self._end(msg + " No presses left. You lose.", 0.0, True)
        return self._end(msg + "\n" + self._status(), 0.0, False)

    def _end(self, obs, reward, terminated):
        truncated = False
        if terminated:
            self.done = True
        elif self.turn >= self.max_turns:
            self.done, truncated = True, True
            obs += "\nOut of turns. Solution: " + self.solution()
        return obs, reward, terminated, truncated, {}

    def solution(self):
        return "".join("\\boxed{" + b + "}" for b in self.plan)

    def hint(self):
        return ("Work backwards from the target: ask which button could have produced it and "
                "from what value, and prefer undoing multiplication when the target is divisible. "
                "Integer division can fix an overshoot.")

    def close(self):
        pass
