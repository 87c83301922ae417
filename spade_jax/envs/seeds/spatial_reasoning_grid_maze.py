"""Grid maze: steer a robot around walls to the goal with a tight move budget.

Skill: Spatial_Reasoning
The map is shown every turn; bumping into a wall or the edge wastes a move.
"""
import random
import re
from collections import deque

BOX = re.compile(r"\\boxed\{([^{}]*)\}")
MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
SIZE = 6


class GridMazeEnv:
    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def _bfs(self, start):
        prev = {start: None}
        queue = deque([start])
        while queue:
            cell = queue.popleft()
            for name, (dr, dc) in MOVES.items():
                nxt = (cell[0] + dr, cell[1] + dc)
                if self._free(nxt) and nxt not in prev:
                    prev[nxt] = (cell, name)
                    queue.append(nxt)
        return prev

    def _free(self, cell):
        r, c = cell
        return 0 <= r < SIZE and 0 <= c < SIZE and cell not in self.walls

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:
            cells = [(r, c) for r in range(SIZE) for c in range(SIZE)]
            rng.shuffle(cells)
            self.walls = set(cells[:10])
            self.pos, self.goal = cells[10], cells[11]
            prev = self._bfs(self.pos)
            if self.goal in prev:
                path, cell = [], self.goal
                while prev[cell] is not None:
                    cell, name = prev[cell]
                    path.append(name)
                if 6 <= len(path) <= 10:
                    self.plan = path[::-1]
                    break
        self.moves_left = len(self.plan) + 2
        self.turn = 0
        self.done = False
        rules = ("GRID MAZE. Move the robot R to the goal G. # is a wall, . is floor; row 1 is "
                 "the top. Actions: \\boxed{up}, \\boxed{down}, \\boxed{left}, \\boxed{right}. "
                 "Moving into a wall or off the map wastes the move. Reach G before your moves "
                 "run out.")
        return rules + "\n" + self._status(), {}

    def _status(self):
        rows = []
        for r in range(SIZE):
            row = ""
            for c in range(SIZE):
                cell = (r, c)
                row += "R" if cell == self.pos else "G" if cell == self.goal else \
                    "#" if cell in self.walls else "."
            rows.append(row)
        return "\n".join(rows) + f"\nMoves left: {self.moves_left}."

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        found = BOX.findall(str(action))
        move = found[-1].strip().lower() if found else ""
        if move not in MOVES:
            return self._end("Use \\boxed{up}, \\boxed{down}, \\boxed{left} or \\boxed{right}.\n"
                             + self._status(), 0.0, False)
        self.moves_left -= 1
        nxt = (self.pos[0] + MOVES[move][0], self.pos[1] + MOVES[move][1])
        if self._free(nxt):
            self.pos = nxt
            msg = f"You moved {move}."
        else:
            msg = f"Blocked: you cannot move {move}."
        if self.pos == self.goal:
            return self._end(msg + " You reached the goal! You win.", 1.0, True)
        if self.moves_left <= 0:
            return self._end(msg + " Out of moves. You lose.", 0.0, True)
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
        return "".join("\\boxed{" + m + "}" for m in self.plan)

    def hint(self):
        return ("Before moving, trace a route on the map from R to G that avoids every #; the "
                "budget leaves room for only two wasted moves. Count the row and column offsets "
                "and check the cells next to walls carefully.")

    def close(self):
        pass
