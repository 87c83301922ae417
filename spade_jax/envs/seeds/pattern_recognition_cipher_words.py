"""Cipher words: infer a letter cipher from examples and test queries, then decode two words.

Skill: Pattern_Recognition
Two actions: encode a probe word (limited), or decode the current secret word.
"""
import random
import re

BOX = re.compile(r"\\boxed\{([^{}]*)\}")
WORDS = ["apple", "river", "stone", "cloud", "tiger", "maple", "pearl", "flint", "grape",
         "honey", "lemon", "north", "piano", "quilt", "robin", "sugar", "table", "wheat",
         "yacht", "zebra", "brick", "candle", "forest", "garden", "marble", "orange"]
ABC = "abcdefghijklmnopqrstuvwxyz"


class CipherWordsEnv:
    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def _encode(self, word):
        out = ""
        for i, ch in enumerate(word):
            shift = self.shift + (i * self.step_size)
            out += ABC[(ABC.index(ch) + shift) % 26]
        return out[::-1] if self.reverse else out

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.shift = rng.randint(1, 25)
        self.step_size = rng.choice([0, 0, 1])
        self.reverse = rng.random() < 0.4
        words = rng.sample(WORDS, 4)
        self.examples, self.secrets = words[:2], words[2:]
        self.stage = 0
        self.probes = 3
        self.lives = 2
        self.turn = 0
        self.done = False
        ex = "; ".join(f"{w} -> {self._encode(w)}" for w in self.examples)
        rules = ("CIPHER WORDS. A secret letter cipher turns words into codes. Examples: " + ex
                 + ".\nActions: \\boxed{encode WORD} shows the code of any lowercase word (3 "
                 "probes); \\boxed{decode WORD} answers the current secret code with the "
                 "original word. A wrong decode costs a life (2 lives). Decode two codes to win.")
        return rules + "\n" + self._status(), {}

    def _status(self):
        return (f"Secret code {self.stage + 1}/2: {self._encode(self.secrets[self.stage])}. "
                f"Probes left: {self.probes}. Lives: {self.lives}.")

    def step(self, action):
        if self.done:
            return "The episode is over.", 0.0, True, False, {}
        self.turn += 1
        found = BOX.findall(str(action))
        words = found[-1].strip().lower().split() if found else []
        if len(words) != 2 or words[0] not in ("encode", "decode") or \
                not words[1].isalpha() or not words[1].isascii():
            return self._end("Use \\boxed{encode WORD} or \\boxed{decode WORD} (letters only).\n"
                             + self._status(), 0.0, False)
        verb, word = words
        if verb == "encode":
            if self.probes <= 0:
                return self._end("No probes left.\n" + self._status(), 0.0, False)
            self.probes -= 1
            return self._end(f"encode({word[:12]}) = {self._encode(word[:12])}\n"
                             + self._status(), 0.0, False)
        if word == self.secrets[self.stage]:
            self.stage += 1
            if self.stage == 2:
                return self._end("Correct! Both codes broken. You win.", 1.0, True)
            return self._end("Correct!\n" + self._status(), 0.0, False)
        self.lives -= 1
        if self.lives <= 0:
            return self._end("Wrong, and no lives left. You lose.", 0.0, True)
        return self._end("Wrong word.\n" + self._status(), 0.0, False)

    def _end(self, obs, reward, terminated):
        truncated = False
        if terminated:
            self.done = True
        elif self.turn >= self.max_turns:
            self.done, truncated = True, True
            obs += "\nOut of turns. Solution: " + self.solution()
        return obs, reward, terminated, truncated, {}

    def solution(self):
        return "".join("\\boxed{decode " + w + "}" for w in self.secrets)

    def hint(self):
        return ("Compare each example letter by letter: check whether the code is reversed and "
                "whether the alphabet shift stays constant or grows by one per position. A probe "
                "such as encode aaaa makes the shift pattern obvious.")

    def close(self):
        pass
