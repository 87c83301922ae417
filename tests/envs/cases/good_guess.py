class GuessNumberEnv:
    """Guess a hidden number in [10, 999] with higher/lower feedback."""

    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        random.seed(seed)
        self.target = random.randint(10, 999)
        self.turn = 0
        self.history = deque(maxlen=5)
        return ("Guess the hidden integer between 10 and 999. "
                "Answer with \\boxed{N}; I will say higher or lower."), {"turn": 0}

    def step(self, action):
        self.turn += 1
        found = re.findall(r"\\boxed\{([^{}]*)\}", action)
        if not found or not found[-1].strip().lstrip("-").isdigit():
            return "Please answer with \\boxed{N}.", -0.1, False, self.turn >= self.max_turns, {}
        guess = int(found[-1])
        self.history.append(guess)
        if guess == self.target:
            return "Correct!", 1.0, True, False, {"turn": self.turn}
        hint = "higher" if guess < self.target else "lower"
        return f"{guess} is wrong, go {hint}.", 0.0, False, self.turn >= self.max_turns, {}

    def solution(self):
        return f"\\boxed{{{self.target}}}"

    def close(self):
        pass
