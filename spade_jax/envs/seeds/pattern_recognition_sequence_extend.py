"""Sequence extend: find the rule of a number sequence and give its next three terms.

Skill: Pattern_Recognition
Easy (3 answers). Each correct term is appended to the visible sequence.
"""
import random
import re

BOX = re.compile(r"\\boxed\{([^{}]*)\}")


def _make(rng):
    kind = rng.choice(["arith", "geom", "squares", "fib", "alt"])
    if kind == "arith":
        a, d = rng.randint(1, 30), rng.choice([-7, -5, -3, 3, 4, 6, 7, 9, 11])
        return [a + d * i for i in range(8)]
    if kind == "geom":
        a, r = rng.randint(1, 5), rng.choice([2, 3])
        return [a * r ** i for i in range(8)]
    if kind == "squares":
        a, d, c = rng.randint(0, 9), rng.randint(1, 4), rng.randint(1, 3)
        out = [a]
        for i in range(7):
            out.append(out[-1] + d + c * i)
        return out
    if kind == "fib":
        out = [rng.randint(1, 5), rng.randint(2, 7)]
        while len(out) < 8:
            out.append(out[-1] + out[-2])
        return out
    a, b = rng.randint(1, 20), rng.randint(30, 60)
    da, db = rng.randint(2, 5), -rng.randint(1, 4)
    return [a + da * (i // 2) if i % 2 == 0 else b + db * (i // 2) for i in range(8)]


class SequenceExtendEnv:
    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.seq = _make(rng)
        self.shown = 5
        self.lives = 2
        self.turn = 0
        self.done = False
        rules = ("SEQUENCE EXTEND. The numbers below follow a hidden rule. Give the next term "
                 "as an integer in \\boxed{...}, e.g. \\boxed{17}. A correct term is added to "
                 "the sequence; a wrong one costs a life (2 lives). Find three more terms to win.")
        return rules + "\n" + self._status(), {}

    def _status(self):
        nums = ", ".join(str(v) for v in self.seq[: self.shown])
        return f"Sequence: {nums}, ?   Terms found: {self.shown - 5}/3. Lives: {self.lives}."

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        found = BOX.findall(str(action))
        try:
            guess = int(found[-1].strip()) if found else None
        except ValueError:
            guess = None
        if guess is None:
            return self._end("Answer with an integer in \\boxed{...}.\n" + self._status(),
                             0.0, False)
        if guess == self.seq[self.shown]:
            self.shown += 1
            if self.shown == 8:
                return self._end("Correct! Three terms found. You win.", 1.0, True)
            return self._end("Correct!\n" + self._status(), 0.0, False)
        self.lives -= 1
        if self.lives <= 0:
            return self._end("Wrong, and no lives left. You lose.", 0.0, True)
        return self._end("Wrong term.\n" + self._status(), 0.0, False)

    def _end(self, obs, reward, terminated):
        truncated = False
        if terminated:
            self.done = True
        elif self.turn >= self.max_turns:
            self.done, truncated = True, True
            obs += "\nOut of turns. Solution: " + self.solution()
        return obs, reward, terminated, truncated, {}

    def solution(self):
        return "".join("\\boxed{" + str(v) + "}" for v in self.seq[5:])

    def hint(self):
        return ("Write down the differences between neighbours; if they are not constant, look "
                "at the differences of the differences, at ratios, at each term as the sum of "
                "the two before it, and at odd and even positions separately.")

    def close(self):
        pass
