"""Compass dig: turn and walk (egocentric moves) to a buried beacon, then dig.

Skill: Spatial_Reasoning
Only your heading is shown, never your position; you must track it yourself.
"""
import random
import re
from collections import deque

BOX = re.compile(r"\\boxed\{([^{}]*)\}")
HEADINGS = ["north", "east", "south", "west"]
STEP = {"north": (0, 1), "east": (1, 0), "south": (0, -1), "west": (-1, 0)}


class CompassDigEnv:
    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def _next(self, state, act):
        x, y, h = state
        if act == "left":
            return (x, y, (h - 1) % 4)
        if act == "right":
            return (x, y, (h + 1) % 4)
        dx, dy = STEP[HEADINGS[h]]
        return (x + dx, y + dy, h)

    def _plan(self):
        start = (0, 0, self.heading)
        prev = {start: None}
        queue = deque([start])
        while queue:
            s = queue.popleft()
            if (s[0], s[1]) == self.beacon:
                acts = ["dig"]
                while prev[s] is not None:
                    s, a = prev[s]
                    acts.append(a)
                return acts[::-1]
            for a in ("forward", "left", "right"):
                t = self._next(s, a)
                if t not in prev and abs(t[0]) <= 6 and abs(t[1]) <= 6:
                    prev[t] = (s, a)
                    queue.append(t)
        return ["dig"]

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:
            self.beacon = (rng.randint(-3, 3), rng.randint(-3, 3))
            if abs(self.beacon[0]) + abs(self.beacon[1]) >= 3:
                break
        self.heading = rng.randrange(4)
        self.plan = self._plan()
        self.state = (0, 0, self.heading)
        self.actions_left = len(self.plan) + 2
        self.turn = 0
        self.done = False
        bx, by = self.beacon
        where = (f"{abs(by)} step(s) {'north' if by >= 0 else 'south'} and {abs(bx)} step(s) "
                 f"{'east' if bx >= 0 else 'west'} of your starting square")
        rules = ("COMPASS DIG. A beacon is buried " + where + ". Actions: \\boxed{forward} "
                 "(one step in the direction you face), \\boxed{left} / \\boxed{right} (turn 90 "
                 "degrees in place), \\boxed{dig} (dig here: the beacon wins, anything else "
                 "loses). Your position is never shown; only your heading.")
        return rules + "\n" + self._status(), {}

    def _status(self):
        return (f"You face {HEADINGS[self.state[2]]}. Actions left: {self.actions_left}. "
                "Actions: forward, left, right, dig.")

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        found = BOX.findall(str(action))
        act = found[-1].strip().lower() if found else ""
        if act not in ("forward", "left", "right", "dig"):
            return self._end("Use \\boxed{forward}, \\boxed{left}, \\boxed{right} or "
                             "\\boxed{dig}.\n" + self._status(), 0.0, False)
        self.actions_left -= 1
        if act == "dig":
            if (self.state[0], self.state[1]) == self.beacon:
                return self._end("You dig... and find the beacon! You win.", 1.0, True)
            return self._end("You dig and find only dirt. You lose.", 0.0, True)
        self.state = self._next(self.state, act)
        msg = "You step forward." if act == "forward" else f"You turn {act}."
        if self.actions_left <= 0:
            return self._end(msg + " You are out of actions. You lose.", 0.0, True)
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
        return "".join("\\boxed{" + a + "}" for a in self.plan)

    def hint(self):
        return ("Keep a running (east, north) offset from the start and update it after every "
                "forward step according to your current heading. Turning right from north gives "
                "east; finish one axis completely before turning toward the other.")

    def close(self):
        pass
