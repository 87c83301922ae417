"""Knapsack pack: pack items one at a time to reach the best total value within capacity.

Skill: Optimization
Actions: take or drop an item; declare done. Done wins only with an optimal pack.
"""
import itertools
import random
import re

BOX = re.compile(r"\\boxed\{([^{}]*)\}")


class KnapsackPackEnv:
    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:
            self.items = [(rng.randint(2, 9), rng.randint(3, 20)) for _ in range(6)]
            self.cap = sum(w for w, _ in self.items) * 2 // 5
            best, best_sets = -1, []
            for r in range(7):
                for combo in itertools.combinations(range(6), r):
                    w = sum(self.items[i][0] for i in combo)
                    v = sum(self.items[i][1] for i in combo)
                    if w <= self.cap and v > best:
                        best, best_sets = v, [combo]
                    elif w <= self.cap and v == best:
                        best_sets.append(combo)
            greedy = self._greedy()
            if len(best_sets) == 1 and len(best_sets[0]) >= 2 and greedy != best:
                break
        self.best, self.best_set = best, best_sets[0]
        self.packed = set()
        self.turn = 0
        self.done = False
        table = "\n".join(f"  item {i + 1}: weight {w}, value {v}"
                          for i, (w, v) in enumerate(self.items))
        rules = ("KNAPSACK PACK. Pack items into a bag of capacity " + str(self.cap) + ":\n"
                 + table + "\nActions: \\boxed{take N}, \\boxed{drop N}, \\boxed{done}. "
                 "A take that would exceed the capacity is refused. When you say done, you win "
                 "only if no packing within the capacity has a higher total value.")
        return rules + "\n" + self._status(), {}

    def _greedy(self):
        order = sorted(range(6), key=lambda i: -self.items[i][1] / self.items[i][0])
        w = v = 0
        for i in order:
            if w + self.items[i][0] <= self.cap:
                w, v = w + self.items[i][0], v + self.items[i][1]
        return v

    def _status(self):
        w = sum(self.items[i][0] for i in self.packed)
        v = sum(self.items[i][1] for i in self.packed)
        names = ", ".join(str(i + 1) for i in sorted(self.packed)) or "nothing"
        return f"Packed: {names}. Weight {w}/{self.cap}. Value {v}."

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        found = BOX.findall(str(action))
        words = found[-1].strip().lower().split() if found else []
        if words == ["done"]:
            v = sum(self.items[i][1] for i in self.packed)
            if v == self.best:
                return self._end(f"Value {v} is optimal. You win.", 1.0, True)
            return self._end(f"Value {v} is not the best possible. You lose.", 0.0, True)
        if len(words) == 2 and words[0] in ("take", "drop") and words[1].isdigit() and \
                1 <= int(words[1]) <= 6:
            i = int(words[1]) - 1
            if words[0] == "take":
                w = sum(self.items[j][0] for j in self.packed) + self.items[i][0]
                if i in self.packed:
                    msg = f"Item {i + 1} is already packed."
                elif w > self.cap:
                    msg = f"Item {i + 1} does not fit."
                else:
                    self.packed.add(i)
                    msg = f"Packed item {i + 1}."
            elif i in self.packed:
                self.packed.remove(i)
                msg = f"Removed item {i + 1}."
            else:
                msg = f"Item {i + 1} is not packed."
            return self._end(msg + "\n" + self._status(), 0.0, False)
        return self._end("Use \\boxed{take N}, \\boxed{drop N} or \\boxed{done}.\n"
                         + self._status(), 0.0, False)

    def _end(self, obs, reward, terminated):
        truncated = False
        if terminated:
            self.done = True
        elif self.turn >= self.max_turns:
            self.done, truncated = True, True
            obs += "\nOut of turns. Solution: " + self.solution()
        return obs, reward, terminated, truncated, {}

    def solution(self):
        acts = [f"take {i + 1}" for i in self.best_set] + ["done"]
        return "".join("\\boxed{" + a + "}" for a in acts)

    def hint(self):
        return ("Picking items by value per unit of weight is not enough here; compare a few "
                "complete combinations that fill the capacity as tightly as possible. Dropping "
                "an item to make room for a better pair is allowed.")

    def close(self):
        pass
