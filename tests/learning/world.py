"""A tiny world in which a random model can learn within minutes on CPU.

* `build_tokenizer`: a word-level tokenizer of a few dozen tokens with a ChatML template, saved
  as an HF directory (`cfg.model.tokenizer` accepts it). Every word it does not know becomes
  one `[UNK]` token, so the real (long) prompts stay real but cheap, and a random policy hits
  a given answer token with probability about 1/len(vocab) — rarely, but often enough for a
  policy gradient to find.
* `learning_config`: the tiny architecture over that vocabulary, with the knobs a learning test
  needs (learning rate, plays per environment, short turns).
* `TARGET_ENV_TEMPLATE`: the Agent's synthetic multi-turn family — every turn shows a target
  symbol and the Agent must answer with it as its first word.
* `DIAL_ENV_TEMPLATE`: the Designer's parametric family — a valid environment whose difficulty
  level is a parameter of its code.
* `train_until` and `best_window_mean`: the criterion both tests use (the mean over a window of
  cycles, not one noisy cycle); `sabotaged_train`: the broken pipelines it must catch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "<|im_start|>", "<|im_end|>"]
SYMBOLS = ["A", "B", "C", "D"]
LEVELS = ["L0", "L1", "L2", "L3", "L4"]
WORDS = ["system", "user", "assistant", "target", "turn", "right", "wrong", "HINT", "level",
         "E", "F", "G", "H", "yes", "no", "python"]
AGENT_FAMILY = (("A", "B"), ("C", "D"), ("A", "C"), ("B", "D"))  # target choices per member
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tokenizer(directory: Path) -> int:
    """Write the tiny ChatML tokenizer to `directory`; returns its vocabulary size.

    Known words are tokens; the text between two known words, whatever its length, is one
    `[UNK]` (whitespace alone is dropped). The real prompts keep their structure (roles, turns,
    the words an environment uses) at a few dozen tokens each.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS + SYMBOLS + LEVELS + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    known = "|".join(SYMBOLS + LEVELS + WORDS)
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(rf"(?<![\w\\])(?:{known})(?!\w)"), behavior="isolated"),
        pre_tokenizers.Split(Regex(r"\A\s+|\s+\z"), behavior="removed"),
    ])
    core.decoder = decoders.WordPiece(prefix="##")  # joins tokens with single spaces
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="[UNK]", pad_token="[PAD]", bos_token="<|im_start|>",
        eos_token="<|im_end|>", additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    tokenizer.chat_template = CHATML
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(directory))
    return len(vocab)


def learning_config(tokenizer_dir: Path, vocab_size: int):
    """The tiny config on the tiny vocabulary, sized for learning tests."""
    from spade_jax.defaults import arch, base_config

    c = base_config()
    c.model.source = "random"
    c.model.tokenizer = str(tokenizer_dir)
    c.model.arch = arch(vocab_size=vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                        head_dim=16, ffn_dim=128, rope_theta=10000.0, rms_eps=1e-5,
                        tie_embeddings=True, family="llama")
    c.sampling.agent_temperature = 1.0
    c.sampling.designer_temperature = 1.0
    c.sampling.agent_max_new_tokens = 1
    c.sampling.designer_max_new_tokens = 2
    c.sampling.max_context = 128
    c.train.learning_rate = 1e-2
    c.train.weight_decay = 0.0
    c.train.remat = "none"
    c.train.micro_batch = 80  # one fixed batch shape [80, 64] for both tests: one compile
    c.train.seq_len = 128
    c.spade.max_turns = 4
    c.spade.max_attempts = 1
    c.spade.replay_per_cycle = 0
    c.spade.hint_mode = "designer"
    c.spade.no_corpus = True
    # one-token answers never end on EOS; each test sizes its own cycle's plays and designs
    c.spade.cut_reply_truncates = False
    c.spade.fill_batch = False
    c.spade.top_up = False
    c.sandbox.warm_workers = 8
    c.checkpoint_every = 10_000
    return c


TARGET_ENV_TEMPLATE = '''\
import random


class Target{name}Env:
    """Every turn shows the episode's target symbol; a right answer starts with it."""

    CHOICES = {choices!r}  # the symbols this member draws its target from
    TURNS = {turns}
    REPEAT = {repeat}

    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.targets = []
        self.turn = 0
        self.correct = 0

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.targets = [rng.choice(self.CHOICES)] * self.TURNS
        self.turn = 0
        self.correct = 0
        return self._observation(), {{}}

    def _observation(self):
        shown = " ".join([self.targets[self.turn]] * self.REPEAT)
        return "turn " + "EFGH"[self.turn] + " target " + shown

    def step(self, action):
        words = str(action).split()
        if words and words[0] == self.targets[self.turn]:
            self.correct += 1
        self.turn += 1
        if self.turn == self.TURNS:
            return "done", self.correct / self.TURNS, True, False, {{}}
        return self._observation(), 0.0, False, False, {{}}

    def solution(self):
        return " ".join(self.targets)

    def close(self):
        pass
'''


def target_env_code(name: str, choices, turns: int = 4, repeat: int = 4) -> str:
    """Code of one member of the Agent's family: targets drawn from `choices`."""
    return TARGET_ENV_TEMPLATE.format(name=name, choices=list(choices), turns=turns,
                                      repeat=repeat)


DIAL_ENV_TEMPLATE = '''\
import random

DESIGN = {design!r}


class DialLevel{level}Env:
    """Turn a dial to a hidden setting in 1..{size}; each wrong guess says higher or lower."""

    LEVEL = {level}
    SIZE = {size}

    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.secret = 1
        self.turns = 0

    def reset(self, seed=None):
        self.secret = random.Random(seed).randint(1, self.SIZE)
        self.turns = 0
        return "A dial goes from 1 to {size}. Answer with \\\\boxed{{n}}.", {{"level": self.LEVEL}}

    def step(self, action):
        self.turns += 1
        text = str(action)
        start = text.rfind("\\\\boxed{{")
        guess = text[start + 7:].split("}}")[0].strip() if start >= 0 else ""
        if guess == str(self.secret):
            return "The dial clicks into place.", 1.0, True, False, {{}}
        if not guess.isdigit():
            return "Answer with \\\\boxed{{n}}.", 0.0, False, False, {{}}
        hint = "higher" if int(guess) < self.secret else "lower"
        return "Not there: go " + hint + ".", 0.0, False, False, {{}}

    def solution(self):
        return "\\\\boxed{{" + str(self.secret) + "}}"

    def close(self):
        pass
'''


def dial_env_code(level: int, design: str) -> str:
    """Code of the Designer family's member at difficulty `level` (a bigger dial)."""
    return DIAL_ENV_TEMPLATE.format(level=level, size=(level + 1) * 20, design=design)


# The scripted Agent of fixed skill: its return without / with the hint, per dial level (its win
# probability, paid out without sampling noise). The hint helps most at L2 (regret 0.75; L3
# is second at 0.25); the Designer's best choice is L2.
SCRIPTED_RETURN = {0: (0.95, 1.0), 1: (0.7, 0.9), 2: (0.15, 0.9), 3: (0.05, 0.3), 4: (0.0, 0.05)}
MAX_REGRET_LEVEL = max(SCRIPTED_RETURN,
                       key=lambda lv: SCRIPTED_RETURN[lv][1] - SCRIPTED_RETURN[lv][0])


def best_window_mean(curve: list[float], window: int) -> float:
    """The highest mean over `window` consecutive cycles of `curve` (0.0 while it is shorter)."""
    means = [float(np.mean(curve[i:i + window])) for i in range(len(curve) - window + 1)]
    return max(means, default=0.0)


def train_until(run_cycle: Callable[[], float], *, budget: int, window: int,
                threshold: float) -> list[float]:
    """Run cycles until the last `window` of them average at least `threshold`, or `budget`
    cycles have run; the per-cycle values `run_cycle` returned (rounded to 3 decimals)."""
    curve: list[float] = []
    while len(curve) < budget:
        curve.append(round(float(run_cycle()), 3))
        if len(curve) >= window and np.mean(curve[-window:]) >= threshold:
            break
    return curve


def _sign_flipped(sample):
    return dataclasses.replace(sample, advantage=-sample.advantage)


def _mask_shifted(sample):
    """The loss mask and its log-probs one token early: the token before each generated one
    is trained in its place (one token late would drop a sequence-final generated token)."""
    earlier = lambda a: np.concatenate([a[1:], np.zeros(1, a.dtype)])  # noqa: E731
    return dataclasses.replace(sample, loss_mask=earlier(sample.loss_mask),
                               behaviour_logp=earlier(sample.behaviour_logp))


SABOTAGES = {"advantage_sign_flipped": _sign_flipped, "loss_mask_shifted": _mask_shifted}


def sabotaged_train(train: Callable, role: str, sabotage: str) -> Callable:
    """`Runtime.train` with the `SABOTAGES[sabotage]` bug applied to every sample of `role`:
    a broken pipeline that a learning test must not pass."""
    broken = SABOTAGES[sabotage]

    def train_broken(samples):
        return train([broken(s) if s.role == role else s for s in samples])
    return train_broken
