"""Knights and knaves: classify five islanders from their statements, one per turn.

Skill: Logical_Deduction
Knights always tell the truth and knaves always lie; exactly one assignment fits.
"""
import itertools
import random
import re

BOX = re.compile(r"\\boxed\{([^{}]*)\}")
NAMES = ["Ana", "Ben", "Cai", "Dee", "Eli"]


def _holds(stmt, world):
    kind = stmt[0]
    if kind == "is":
        return world[stmt[1]] == stmt[2]
    if kind == "same":
        return world[stmt[1]] == world[stmt[2]]
    return sum(world) == stmt[1]


def _say(stmt):
    if stmt[0] == "is":
        return f"{NAMES[stmt[1]]} is a {'knight' if stmt[2] else 'knave'}."
    if stmt[0] == "same":
        return f"{NAMES[stmt[1]]} and {NAMES[stmt[2]]} are of the same kind."
    return f"Exactly {stmt[1]} of us five are knights."


class KnightsKnavesEnv:
    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:
            stmts = []
            for i in range(5):
                others = [j for j in range(5) if j != i]
                kind = rng.choice(["is", "is", "same", "count"])
                if kind == "is":
                    stmts.append(("is", rng.choice(others), rng.random() < 0.5))
                elif kind == "same":
                    j, k = rng.sample(others, 2)
                    stmts.append(("same", j, k))
                else:
                    stmts.append(("count", rng.randint(1, 4)))
            fits = [w for w in itertools.product([True, False], repeat=5)
                    if all(_holds(s, w) == w[i] for i, s in enumerate(stmts))]
            if len(fits) == 1:
                break
        self.world, self.stmts = fits[0], stmts
        self.known = {}
        self.turn = 0
        self.done = False
        lines = "\n".join(f"  {NAMES[i]} says: \"{_say(s)}\"" for i, s in enumerate(stmts))
        rules = ("KNIGHTS AND KNAVES. Knights always tell the truth; knaves always lie. "
                 "Five islanders speak:\n" + lines + "\nDeclare one islander per turn, e.g. "
                 "\\boxed{Ana knight} or \\boxed{Ben knave}. One wrong declaration loses; "
                 "declare all five correctly to win.")
        return rules + "\n" + self._status(), {}

    def _status(self):
        todo = [n for n in NAMES if n not in self.known]
        return "Still to declare: " + ", ".join(todo) + "."

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        found = BOX.findall(str(action))
        words = found[-1].replace(",", " ").lower().split() if found else []
        names = [n.lower() for n in NAMES]
        if len(words) != 2 or words[0] not in names or words[1] not in ("knight", "knave"):
            return self._end("Format: \\boxed{<name> knight} or \\boxed{<name> knave}.\n"
                             + self._status(), 0.0, False)
        i, says = names.index(words[0]), words[1] == "knight"
        if NAMES[i] in self.known:
            return self._end(f"{NAMES[i]} is already declared.\n" + self._status(), 0.0, False)
        if self.world[i] != says:
            return self._end(f"Wrong: {NAMES[i]} is not a {words[1]}. You lose.", 0.0, True)
        self.known[NAMES[i]] = says
        if len(self.known) == 5:
            return self._end("Correct! Everyone is classified. You win.", 1.0, True)
        return self._end(f"Correct: {NAMES[i]} is a {words[1]}.\n" + self._status(), 0.0, False)

    def _end(self, obs, reward, terminated):
        truncated = False
        if terminated:
            self.done = True
        elif self.turn >= self.max_turns:
            self.done, truncated = True, True
            obs += "\nOut of turns. Solution: " + self.solution()
        return obs, reward, terminated, truncated, {}

    def solution(self):
        kinds = ["knight" if k else "knave" for k in self.world]
        return "".join("\\boxed{" + n + " " + k + "}" for n, k in zip(NAMES, kinds, strict=True))

    def hint(self):
        return ("Suppose one islander is a knight, follow what their statement forces about the "
                "others, and discard the supposition if it contradicts someone. A statement about "
                "how many knights there are is the strongest constraint.")

    def close(self):
        pass
