"""A reasoning-gym dataset as a one-step environment under our contract (self-contained).

This file is environment code: it imports only the standard library and `reasoning_gym`, and
`BOUND_KWARGS` names the dataset (`name`, `config`, `dataset_seed`, `size`). `reset(seed)`
shows item `seed` of the dataset; the agent answers in its last `\\boxed{...}`, scored by the
dataset's own `score_answer` (reward in [0, 1], terminated).
"""

BOUND_KWARGS: dict = {}

REASONING_GYM_INSTALL = "pip install reasoning-gym"
ANSWER_FORMAT = "\n\nGive your final answer as \\boxed{answer}."


def last_boxed(text: str):
    """Content of the last `\\boxed{...}` (balanced braces), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for index in range(begin - 1, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:index]
    return None


def create_dataset(name: str, config: dict, dataset_seed: int, size: int):
    """reasoning-gym's `create_dataset`, with the install command on a missing package."""
    try:
        import reasoning_gym
    except ImportError as error:
        raise ImportError(f"reasoning-gym evaluation needs: {REASONING_GYM_INSTALL}") from error
    return reasoning_gym.create_dataset(name, seed=dataset_seed, size=size, **config)


class ReasoningGymEnv:
    """Items of one reasoning-gym dataset; the reset seed picks the item."""

    def __init__(self, max_turns: int = 1, **kwargs):
        kwargs = {**BOUND_KWARGS, **kwargs}
        self.max_turns = max_turns
        self.name = kwargs["name"]
        self.size = int(kwargs.get("size", 100))
        self.dataset = create_dataset(
            self.name, dict(kwargs.get("config", {})), int(kwargs.get("dataset_seed", 0)), self.size
        )
        self.item = None

    def reset(self, seed=None, options=None):
        """Show item `seed` (modulo the dataset size; item 0 when no seed is given)."""
        self.index = (seed or 0) % self.size
        self.item = self.dataset[self.index]
        self.done = False
        return self.item["question"] + ANSWER_FORMAT, {"index": self.index}

    def step(self, action):
        """Score the last \\boxed{} answer with the dataset's scorer; the episode ends."""
        if self.item is None or self.done:
            raise RuntimeError("call reset() before step()")
        self.done = True
        answer = last_boxed(str(action))
        score = float(self.dataset.score_answer(answer, self.item))
        info = {"index": self.index, "answer": answer, "score": score}
        return "", score, True, False, info

    def solution(self):
        """The dataset's reference answer, boxed."""
        if self.item is None:
            raise RuntimeError("call reset() before solution()")
        if self.item["answer"] is None:
            raise ValueError(f"reasoning-gym dataset {self.name!r} has no reference answers")
        return "\\boxed{" + str(self.item["answer"]) + "}"

    def close(self):
        """Nothing to release."""
