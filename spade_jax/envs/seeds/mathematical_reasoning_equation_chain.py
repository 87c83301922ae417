"""Equation chain: solve three linked equations, revealed one at a time.

Skill: Mathematical_Reasoning
Easy (3 answers). Each equation uses the value found in the previous one.
"""
import random
import re

BOX = re.compile(r"\\boxed\{([^{}]*)\}")


class EquationChainEnv:
    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        x = rng.randint(3, 19)
        a, b = rng.randint(2, 9), rng.randint(1, 40)
        c, d = rng.randint(2, 6), rng.randint(1, 30)
        m = rng.randint(5, 11)
        y = c * x - d
        z = (x + y) % m
        self.equations = [
            f"{a} * x + {b} = {a * x + b}.  What is x?",
            f"y = {c} * x - {d}.  What is y?",
            f"z = (x + y) mod {m}  (the remainder of x + y divided by {m}).  What is z?",
        ]
        self.answers = [x, y, z]
        self.stage = 0
        self.lives = 2
        self.turn = 0
        self.done = False
        intro = ("EQUATION CHAIN. Solve three equations in order; each one uses the values you "
                 "found before. Answer with the integer in \\boxed{...}, e.g. \\boxed{12}. "
                 "A wrong answer costs a life; you have 2 lives. Solve all three to win.")
        return intro + "\n" + self._status(), {}

    def _status(self):
        return (f"Equation {self.stage + 1}/3: {self.equations[self.stage]}\n"
                f"Lives: {self.lives}. Action: \\boxed{{<integer>}}")

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        found = BOX.findall(str(action))
        if not found:
            return self._end("Format reminder: put your integer answer in \\boxed{...}.\n"
                             + self._status(), 0.0, False)
        try:
            guess = int(found[-1].strip().replace(" ", ""))
        except ValueError:
            return self._end("That is not an integer.\n" + self._status(), 0.0, False)
        if guess == self.answers[self.stage]:
            self.stage += 1
            if self.stage == 3:
                return self._end("Correct! All three equations solved. You win.", 1.0, True)
            return self._end("Correct!\n" + self._status(), 0.0, False)
        self.lives -= 1
        if self.lives <= 0:
            return self._end("Wrong, and no lives left. You lose.", 0.0, True)
        return self._end("Wrong answer.\n" + self._status(), 0.0, False)

    def _end(self, obs, reward, terminated):
        truncated = False
        if terminated:
            self.done = True
        elif self.turn >= self.max_turns:
            self.done, truncated = True, True
            obs += "\nOut of turns. Solution: " + self.solution()
        return obs, reward, terminated, truncated, {}

    def solution(self):
        return "".join("\\boxed{" + str(v) + "}" for v in self.answers)

    def hint(self):
        return ("Undo the first equation by subtracting the constant and then dividing by the "
                "coefficient; carry each exact value forward. For a mod, take x + y and subtract "
                "the largest multiple of the modulus that fits.")

    def close(self):
        pass
