"""Plant lab: field notes are confounded; run controlled tests to find what really drives growth.

Skill: Causal_Inference
Two actions: run a controlled test with chosen factors, or name the causal factors (one attempt).
"""
import random
import re

BOX = re.compile(r"\\boxed\{([^{}]*)\}")
FACTORS = ["water", "light", "compost", "music", "pruning"]


def _describe(setting):
    return ", ".join(f"{f}={'on' if on else 'off'}" for f, on in zip(FACTORS, setting, strict=True))


class PlantLabEnv:
    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def _growth(self, setting):
        return self.base + sum(self.effect[f] for f, on in zip(FACTORS, setting, strict=True) if on)

    def reset(self, seed=None):
        rng = random.Random(seed)
        k = rng.choice([1, 2, 2, 3])
        self.causes = sorted(rng.sample(FACTORS, k), key=FACTORS.index)
        self.effect = {f: (rng.randint(3, 9) if f in self.causes else 0) for f in FACTORS}
        self.base = rng.randint(2, 6)
        decoy = rng.choice([f for f in FACTORS if f not in self.causes])
        notes = []
        for _ in range(5):
            sunny = rng.random() < 0.5
            setting = [rng.random() < 0.5 for _ in FACTORS]
            setting[FACTORS.index(decoy)] = sunny   # the decoy is used on sunny days only
            grow = self._growth(setting) + (8 if sunny else 0)
            notes.append(f"  {_describe(setting)} -> {grow} cm")
        self.tests_left = 6
        self.turn = 0
        self.done = False
        rules = ("PLANT LAB. Five factors can be on or off: " + ", ".join(FACTORS) + ". Field "
                 "notes from the garden (weather not recorded; sunny days add growth):\n"
                 + "\n".join(notes) + "\nIn the lab there is no weather. Actions:\n"
                 "  \\boxed{test w l c m p} - grow a plant with each factor 1 (on) or 0 (off), "
                 "in the order water light compost music pruning, e.g. \\boxed{test 1 0 0 1 0} "
                 "(6 tests)\n"
                 "  \\boxed{answer f1 f2 ...} - name exactly the factors that change growth "
                 "(one or more factor names). One attempt: right wins, wrong loses.")
        return rules + "\n" + self._status(), {}

    def _status(self):
        return f"Lab tests left: {self.tests_left}."

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        found = BOX.findall(str(action))
        words = found[-1].replace(",", " ").strip().lower().split() if found else []
        if len(words) == 6 and words[0] == "test" and all(w in ("0", "1") for w in words[1:]):
            if self.tests_left <= 0:
                return self._end("No lab tests left; give your answer.", 0.0, False)
            self.tests_left -= 1
            setting = [w == "1" for w in words[1:]]
            return self._end(f"Lab result: {_describe(setting)} -> {self._growth(setting)} cm.\n"
                             + self._status(), 0.0, False)
        if len(words) >= 2 and words[0] == "answer" and all(w in FACTORS for w in words[1:]):
            named = sorted(set(words[1:]), key=FACTORS.index)
            if named == self.causes:
                return self._end("Correct: those are exactly the causal factors. You win.",
                                 1.0, True)
            return self._end("That is not the right set of factors. You lose.", 0.0, True)
        return self._end("Use \\boxed{test w l c m p} with 0/1 values or \\boxed{answer f1 ...} "
                         "with factor names.\n" + self._status(), 0.0, False)

    def _end(self, obs, reward, terminated):
        truncated = False
        if terminated:
            self.done = True
        elif self.turn >= self.max_turns:
            self.done, truncated = True, True
            obs += "\nOut of turns. Solution: " + self.solution()
        return obs, reward, terminated, truncated, {}

    def solution(self):
        tests = ["test 0 0 0 0 0"] + ["test " + " ".join("1" if j == i else "0" for j in range(5))
                                      for i in range(5)]
        acts = tests + ["answer " + " ".join(self.causes)]
        return "".join("\\boxed{" + a + "}" for a in acts)

    def hint(self):
        return ("Do not trust the field notes: the weather is hidden and moves along with one "
                "factor. Run a baseline with everything off, then switch on one factor at a "
                "time and see which ones change the growth.")

    def close(self):
        pass
