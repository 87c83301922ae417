"""Delivery route: visit five stops in an order that makes the round trip shortest.

Skill: Optimization
Each action drives to one stop; the van returns to the depot after the last stop.
"""
import itertools
import random
import re

BOX = re.compile(r"\\boxed\{([^{}]*)\}")
STOPS = "ABCDE"


class DeliveryRouteEnv:
    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def _length(self, order):
        route = ["H"] + list(order) + ["H"]
        return sum(self.dist[route[i]][route[i + 1]] for i in range(len(route) - 1))

    def _nearest(self):
        here, order = "H", []
        while len(order) < len(STOPS):
            here = min((s for s in STOPS if s not in order), key=lambda s: self.dist[here][s])
            order.append(here)
        return order

    def reset(self, seed=None):
        rng = random.Random(seed)
        nodes = ["H"] + list(STOPS)
        while True:
            self.dist = {a: {a: 0} for a in nodes}
            for a, b in itertools.combinations(nodes, 2):
                self.dist[a][b] = self.dist[b][a] = rng.randint(2, 19)
            lengths = {p: self._length(p) for p in itertools.permutations(STOPS)}
            self.best = min(lengths.values())
            n_best = sum(1 for v in lengths.values() if v == self.best)
            if n_best == 2 and self._length(self._nearest()) > self.best:
                break   # one optimal tour (either direction) and greedy driving misses it
        self.plan = min(p for p, v in lengths.items() if v == self.best)
        self.route = []
        self.turn = 0
        self.done = False
        header = "     " + "".join(f"{b:>4}" for b in nodes)
        rows = [f"{a:>4} " + "".join(f"{self.dist[a][b]:>4}" for b in nodes) for a in nodes]
        rules = ("DELIVERY ROUTE. A van starts at depot H and must visit stops A-E once each, "
                 "then it drives back to H. Travel times:\n" + header + "\n" + "\n".join(rows)
                 + "\nAction: \\boxed{go X} drives to stop X. You win if the finished round "
                 "trip has the shortest possible total time; any longer trip loses.")
        return rules + "\n" + self._status(), {}

    def _status(self):
        left = [s for s in STOPS if s not in self.route]
        time = self._length(self.route) - self.dist[self.route[-1] if self.route else "H"]["H"]
        return (f"Route so far: H{'-' + '-'.join(self.route) if self.route else ''}. "
                f"Time so far: {time}. Stops left: {', '.join(left)}.")

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        found = BOX.findall(str(action))
        words = found[-1].strip().upper().split() if found else []
        if len(words) != 2 or words[0] != "GO" or words[1] not in STOPS:
            return self._end("Use \\boxed{go X} with X one of A-E.\n" + self._status(),
                             0.0, False)
        if words[1] in self.route:
            return self._end(f"Stop {words[1]} is already served.\n" + self._status(),
                             0.0, False)
        self.route.append(words[1])
        if len(self.route) < len(STOPS):
            return self._end(f"Drove to {words[1]}.\n" + self._status(), 0.0, False)
        total = self._length(self.route)
        if total == self.best:
            return self._end(f"Back at H. Total time {total} is the shortest. You win.", 1.0, True)
        return self._end(f"Back at H. Total time {total} is not the shortest. You lose.",
                         0.0, True)

    def _end(self, obs, reward, terminated):
        truncated = False
        if terminated:
            self.done = True
        elif self.turn >= self.max_turns:
            self.done, truncated = True, True
            obs += "\nOut of turns. Solution: " + self.solution()
        return obs, reward, terminated, truncated, {}

    def solution(self):
        return "".join("\\boxed{go " + s + "}" for s in self.plan)

    def hint(self):
        return ("Nearest-neighbour driving is a trap here: also count the final leg back to H. "
                "Compare a few complete tours, and note that a tour and its reverse take the same "
                "time.")

    def close(self):
        pass
