"""Pipe fault: find the single blocked valve in a water line by probing, then repair it.

Skill: Causal_Inference
Water reaches a station only if every valve upstream of it works; probes are limited.
"""
import math
import random
import re

BOX = re.compile(r"\\boxed\{([^{}]*)\}")


class PipeFaultEnv:
    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.n = rng.randint(13, 24)
        self.fault = rng.randint(1, self.n)
        self.probes_left = math.ceil(math.log2(self.n))
        self.log = []
        self.turn = 0
        self.done = False
        self.plan = self._plan()
        rules = ("PIPE FAULT. Water enters at the source and flows through valves 1, 2, ..., "
                 f"{self.n} in a line. Exactly one valve is stuck shut, so water stops there: a "
                 "gauge right after valve k shows flow only if valves 1..k all work. Actions:\n"
                 f"  \\boxed{{probe k}} - read the gauge after valve k ({self.probes_left} "
                 "probes in total)\n"
                 "  \\boxed{repair k} - replace valve k; the stuck valve wins, any other "
                 "valve loses (one attempt).")
        return rules + "\n" + self._status(), {}

    def _plan(self):
        lo, hi, acts = 1, self.n, []
        while lo < hi:
            mid = (lo + hi) // 2
            acts.append(f"probe {mid}")
            if mid < self.fault:
                lo = mid + 1
            else:
                hi = mid
        return acts + [f"repair {lo}"]

    def _status(self):
        seen = ", ".join(self.log) if self.log else "none"
        return f"Gauge readings: {seen}. Probes left: {self.probes_left}."

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        found = BOX.findall(str(action))
        words = found[-1].strip().lower().split() if found else []
        if len(words) != 2 or words[0] not in ("probe", "repair") or not words[1].isdigit() \
                or not 1 <= int(words[1]) <= self.n:
            msg = f"Use \\boxed{{probe k}} or \\boxed{{repair k}} with k in 1..{self.n}.\n"
            return self._end(msg + self._status(), 0.0, False)
        k = int(words[1])
        if words[0] == "repair":
            if k == self.fault:
                return self._end(f"Valve {k} was stuck. Water flows again! You win.", 1.0, True)
            return self._end(f"Valve {k} was fine; the line is still blocked. You lose.",
                             0.0, True)
        if self.probes_left <= 0:
            return self._end("No probes left; you must repair a valve.\n" + self._status(),
                             0.0, False)
        self.probes_left -= 1
        flow = k < self.fault
        self.log.append(f"after {k}: {'flow' if flow else 'dry'}")
        return self._end(f"The gauge after valve {k} is {'flowing' if flow else 'dry'}.\n"
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
        return "".join("\\boxed{" + a + "}" for a in self.plan)

    def hint(self):
        return ("A dry gauge after valve k means the stuck valve is k or earlier; flow means it "
                "is later. Probe the middle of the remaining suspects each time, so every probe "
                "halves the list of valves that could be stuck.")

    def close(self):
        pass
