"""A reasoning-gym dataset as a one-step environment under our contract (self-contained).

This file is environment code: it imports only the standard library and `reasoning_gym`, and
`BOUND_KWARGS` names the dataset (`name`, `config`, `dataset_seed`, `size`). `reset(seed)`
shows item `seed` of the dataset; the agent answers in its last `\\boxed{...}`, scored by the
dataset's own `score_answer` (reward in [0, 1], terminated).

`style="rg_paper"` plays an item the way the reference's hard-split evaluation does: the item is
`random.Random(seed).choice(dataset)` (gem seeds `random` with the episode index), the question
is wrapped in reasoning-gym's paper prompt, and the answer is the last `<answer>...</answer>`
(else the last `\\boxed{...}`).
"""

import random
import re

BOUND_KWARGS: dict = {}

REASONING_GYM_INSTALL = "pip install reasoning-gym"
ANSWER_FORMAT = "\n\nGive your final answer as \\boxed{answer}."
STYLES = ("boxed", "rg_paper")
# The reference's rg prompt (reasoning-gym's SYSTEM_PROMPTS["default"] as one user message),
# around the question with gem's boxed suffix, as its gem_evaluator builds it.
RG_PAPER_PROMPT = (
    "Given a problem, your task is to answer the question by thinking step-by-step in a clear "
    "and specific manner.\nProblem: {question}\n\nPut your final answer within \\boxed{{}}.\n"
    "Once you have thought about the reasoning process, provide the answer in the following "
    "format:\n<answer>answer here</answer>\nDo not explain your reasoning inside the answer "
    "tags, provide only the final answer. When an example is provided, you should strictly "
    "follow the format of the output/answer in that example."
)
_ANSWER_TAG = re.compile(r"<answer>\s*(.*?)\s*</answer>", re.DOTALL | re.IGNORECASE)


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


def rg_paper_answer(text: str):
    """The last `<answer>...</answer>` payload (stripped), else the last `\\boxed{...}`."""
    tagged = _ANSWER_TAG.findall(text)
    return tagged[-1].strip() if tagged else last_boxed(text)


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
        self.style = kwargs.get("style", "boxed")
        if self.style not in STYLES:
            raise ValueError(f"style must be one of {STYLES}, got {self.style!r}")
        self.dataset = create_dataset(
            self.name, dict(kwargs.get("config", {})), int(kwargs.get("dataset_seed", 0)), self.size
        )
        self.item = None

    def reset(self, seed=None, options=None):
        """Show item `seed` (modulo the size; 0 without a seed), or in "rg_paper" a seeded pick."""
        if self.style == "rg_paper":
            self.index = random.Random(seed or 0).randrange(self.size)
        else:
            self.index = (seed or 0) % self.size
        self.item = self.dataset[self.index]
        self.done = False
        if self.style == "rg_paper":
            return RG_PAPER_PROMPT.format(question=self.item["question"]), {"index": self.index}
        return self.item["question"] + ANSWER_FORMAT, {"index": self.index}

    def step(self, action):
        """Score the last \\boxed{} answer with the dataset's scorer; the episode ends."""
        if self.item is None or self.done:
            raise RuntimeError("call reset() before step()")
        self.done = True
        extract = rg_paper_answer if self.style == "rg_paper" else last_boxed
        answer = extract(str(action))
        score = float(self.dataset.score_answer(answer, self.item))
        info = {"index": self.index, "answer": answer, "score": score}
        return "", score, True, False, info

    def solution(self):
        """The dataset's reference answer, boxed."""
        if self.item is None:
            raise RuntimeError("call reset() before solution()")
        if self.item["answer"] is None:
            raise ValueError(f"reasoning-gym dataset {self.name!r} has no reference answers")
        if self.style == "rg_paper":
            return f"<answer>{self.item['answer']}</answer>"
        return "\\boxed{" + str(self.item["answer"]) + "}"

    def close(self):
        """Nothing to release."""
