"""Balance sort: order five boxes by weight using a limited number of weighings.

Skill: Logical_Deduction
Two actions: weigh two boxes, or submit the full order (one attempt).
"""
import random
import re

BOX = re.compile(r"\\boxed\{([^{}]*)\}")
LABELS = "ABCDE"


class BalanceSortEnv:
    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        weights = rng.sample(range(1, 100), 5)
        self.weight = dict(zip(LABELS, weights, strict=True))
        self.weighings_left = 8
        self.log = []
        self.turn = 0
        self.done = False
        self.plan = self._plan()
        rules = ("BALANCE SORT. Five boxes A-E have different hidden weights. Actions:\n"
                 "  \\boxed{weigh X Y}  - the balance tells you which of X and Y is heavier "
                 "(uses one weighing; you have 8)\n"
                 "  \\boxed{order XXXXX} - submit all five labels from LIGHTEST to HEAVIEST, "
                 "e.g. \\boxed{order CAEBD}. One attempt only: right wins, wrong loses.")
        return rules + "\n" + self._status(), {}

    def _plan(self):
        """Binary-insertion sort; at most 8 weighings for 5 boxes."""
        acts, done = [], []
        for x in LABELS:
            lo, hi = 0, len(done)
            while lo < hi:
                mid = (lo + hi) // 2
                acts.append(f"weigh {x} {done[mid]}")
                if self.weight[x] < self.weight[done[mid]]:
                    hi = mid
                else:
                    lo = mid + 1
            done.insert(lo, x)
        return acts + ["order " + "".join(done)]

    def _status(self):
        known = "; ".join(self.log) if self.log else "nothing yet"
        return f"Results so far: {known}. Weighings left: {self.weighings_left}."

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        found = BOX.findall(str(action))
        words = found[-1].upper().split() if found else []
        if len(words) == 3 and words[0] == "WEIGH" and words[1] in LABELS and \
                words[2] in LABELS and words[1] != words[2]:
            if self.weighings_left <= 0:
                return self._end("No weighings left; submit an order.\n" + self._status(),
                                 0.0, False)
            x, y = words[1], words[2]
            self.weighings_left -= 1
            heavy, light = (x, y) if self.weight[x] > self.weight[y] else (y, x)
            self.log.append(f"{heavy} > {light}")
            return self._end(f"The balance tips: {heavy} is heavier than {light}.\n"
                             + self._status(), 0.0, False)
        if len(words) == 2 and words[0] == "ORDER" and sorted(words[1]) == list(LABELS):
            truth = "".join(sorted(LABELS, key=self.weight.get))
            if words[1] == truth:
                return self._end("Correct order! You win.", 1.0, True)
            return self._end("That order is wrong. You lose.", 0.0, True)
        return self._end("Unknown action. Use \\boxed{weigh X Y} or \\boxed{order XXXXX} "
                         "with the labels A-E.\n" + self._status(), 0.0, False)

    def _end(self, obs, reward, terminated):
        truncated = False
        if terminated:
            self.done = True
        elif self.turn >= self.max_turns:
            self.done, truncated = True, True
            obs += "\nOut of turns. Solution: " + self.solution()
        return obs, reward, terminated, truncated, {}

    def solution(self):
        return "".join("\\boxed{" + a + "}" for a in self.plan)

    def hint(self):
        return ("Keep a sorted chain of the boxes weighed so far and insert each new box by "
                "comparing it with the middle of the chain first; that never needs more than "
                "eight weighings. Never weigh a pair whose order already follows from earlier "
                "results.")

    def close(self):
        pass
