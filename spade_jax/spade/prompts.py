"""Prompts of both roles, as chat message lists (docs/DESIGN.md §4.2; template applied elsewhere).

Designer prompt, in the reference's order (our wording): role (system); optional
``<REFERENCE_DOCUMENT>`` with the grounding instruction; skill, description and difficulty;
design rules; the environment contract as a skeleton plus one short worked example (a
parameter, so the loop can pass a seed environment); robustness rules; the memory block
(<= 2 positives with win rate and regret, <= 1 negative); the answer format. Variants:
``game`` (actions in ``\\boxed{...}``) and ``tool_use`` (subclass of ``ToolUseEnv``).

Also: the Agent's system prompt and first-turn messages, and the hint prompt of hint mode
``self`` (read the code, write a 1-3 sentence hint that does not give the answer away). The
self-validation pass's prompts are in ``self_validation.py``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Sequence
from typing import Any

from spade_jax.envs.contract import boxed_action
from spade_jax.envs.skills import GAME_SKILLS, TOOL_USE_SKILLS
from spade_jax.spade.memory import MemoryExamples, MemoryRecord


class GameType(enum.StrEnum):
    """What the Designer writes: a text game (``\\boxed{}`` actions) or a tool-use
    environment; each holds its skills, prompts, interface skeleton and worked example."""

    GAME = "game"
    TOOL_USE = "tool_use"

    @property
    def is_tool_use(self) -> bool:
        return self is GameType.TOOL_USE

    @property
    def skills(self) -> dict[str, str]:
        """Skill name -> description, the skills a Designer of this type may be asked for."""
        return TOOL_USE_SKILLS if self.is_tool_use else SKILLS

    @property
    def kind(self) -> str:
        return "tool-use environment" if self.is_tool_use else "multi-turn text game"

    @property
    def designer_system_prompt(self) -> str:
        return TOOL_USE_SYSTEM_PROMPT if self.is_tool_use else GAME_SYSTEM_PROMPT

    @property
    def design_rules(self) -> str:
        return TOOL_USE_DESIGN_RULES if self.is_tool_use else GAME_DESIGN_RULES

    @property
    def skeleton(self) -> str:
        return TOOL_USE_SKELETON if self.is_tool_use else GAME_SKELETON

    @property
    def default_example(self) -> str:
        return DEFAULT_TOOL_USE_EXAMPLE if self.is_tool_use else DEFAULT_GAME_EXAMPLE

    @property
    def agent_system_prompt(self) -> str:
        return TOOL_USE_AGENT_SYSTEM_PROMPT if self.is_tool_use else GAME_AGENT_SYSTEM_PROMPT

    def agent_action(self, reply: str) -> str:
        """What `step` receives of an Agent reply, as the reference's `parse_action`: in a
        game its boxed action alone (`contract.boxed_action`), in tool use the reply
        stripped (the environment parses its `<tool_call>` / `<answer>` blocks)."""
        return reply.strip() if self.is_tool_use else boxed_action(reply)

    @property
    def hint_plays_end_on_cut_reply(self) -> bool:
        """Whether a hint play also ends at a reply cut by its token budget (with
        `spade.cut_reply_truncates`): in tool use, where the reference plays both arms through
        its native tool-call loop and its EOS check; not in a game, whose hint arm steps it."""
        return self.is_tool_use

    @property
    def hint_system_prompt(self) -> str:
        return TOOL_USE_HINT_SYSTEM_PROMPT if self.is_tool_use else GAME_HINT_SYSTEM_PROMPT


MEMORY_CODE_CHARS = 2000
DIFFICULTY_MIN_STEPS = {"easy": 2, "medium": 3, "hard": 4}

SKILLS = GAME_SKILLS  # the names of `spade.game_type=game` (spade_jax/envs/skills.py)

GAME_SYSTEM_PROMPT = (
    "You are an expert Python programmer and game designer. You write interactive, "
    "multi-turn text games as Python classes: the player makes a sequence of decisions and "
    "every action changes the state of the game."
)

TOOL_USE_SYSTEM_PROMPT = (
    "You are an expert designer of tool-calling environments. You write Python classes that "
    "simulate a small system behind a set of tools; an agent must call the tools over several "
    "turns to complete a task."
)

GAME_SKELETON = '''\
import random
import re


class DescriptiveNameEnv:          # exactly one top-level class; its name ends in "Env"
    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.reset()               # every attribute exists before the first step

    def reset(self, seed=None):
        rng = random.Random(seed)  # all randomness from this rng: same seed, same game
        ...                        # build the hidden state and the reference solution
        return first_observation, {}   # rules, goal, starting state, available actions

    def step(self, action):
        # action is "\\boxed{<the player's action>}", or the player's text if it boxed none
        ...
        return observation, reward, terminated, truncated, {}

    def solution(self):
        # the reference answer / action sequence for the current seed, e.g.
        # "\\boxed{a} \\boxed{b}" (computed from the state, never hard-coded)
        ...

    def close(self):
        pass
'''

TOOL_USE_SKELETON = '''\
class DescriptiveNameEnv(ToolUseEnv):  # ToolUseEnv is provided; do not import or define it
    def reset(self, seed=None):
        rng = random.Random(seed)
        self._tools = {
            "lookup": {"description": "...", "parameters": {
                "type": "object", "properties": {"key": {"type": "string"}},
                "required": ["key"]}},
        }
        self._state = {...}                  # the hidden system state the tools act on
        self._expected_answer = ...          # checked against <answer>...</answer>
        return self.task_observation("the task, in words"), {}

    def tool_lookup(self, key):              # one tool_<name> method per tool; returns str
        ...

    def solution(self):
        # the reference sequence of <tool_call>{...}</tool_call> / <answer>...</answer> blocks
        ...
'''

DEFAULT_GAME_EXAMPLE = '''\
import random
import re
from collections import deque


class WaterJugsEnv:
    """Measure an exact amount of water with two jugs."""

    ACTIONS = ("fill A", "fill B", "empty A", "empty B", "pour A B", "pour B A")

    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns
        self.reset()

    def reset(self, seed=None):
        rng = random.Random(seed)
        while True:
            self.cap = (rng.randint(3, 9), rng.randint(4, 13))
            self.target = rng.randint(1, max(self.cap) - 1)
            plan = self._plan((0, 0))
            if plan and 4 <= len(plan) <= self.max_turns // 2:
                break
        self.jugs, self.turn, self.done = (0, 0), 0, False
        rules = (f"WATER JUGS. Jug A holds {self.cap[0]} L, jug B holds {self.cap[1]} L; both "
                 f"start empty. Get exactly {self.target} L into either jug. Actions: "
                 + ", ".join("\\\\boxed{" + a + "}" for a in self.ACTIONS) + ".")
        return rules + "\\n" + self._status(), {}

    def _apply(self, jugs, action):
        a, b = jugs
        if action == "fill A":
            return self.cap[0], b
        if action == "fill B":
            return a, self.cap[1]
        if action == "empty A":
            return 0, b
        if action == "empty B":
            return a, 0
        if action == "pour A B":
            moved = min(a, self.cap[1] - b)
            return a - moved, b + moved
        moved = min(b, self.cap[0] - a)
        return a + moved, b - moved

    def _plan(self, start):
        previous, queue = {start: None}, deque([start])
        while queue:
            jugs = queue.popleft()
            if self.target in jugs:
                plan = []
                while previous[jugs] is not None:
                    jugs, action = previous[jugs]
                    plan.append(action)
                return plan[::-1]
            for action in self.ACTIONS:
                nxt = self._apply(jugs, action)
                if nxt not in previous:
                    previous[nxt] = (jugs, action)
                    queue.append(nxt)
        return None

    def _status(self):
        return (f"A: {self.jugs[0]}/{self.cap[0]} L, B: {self.jugs[1]}/{self.cap[1]} L. "
                f"Turn {self.turn}/{self.max_turns}.")

    def step(self, action):
        if self.done:
            return "The game is over.", 0.0, True, False, {}
        found = re.findall(r"\\\\boxed\\{([^{}]*)\\}", str(action))
        choice = " ".join(found[-1].split()) if found else ""
        if choice not in self.ACTIONS:
            return "Answer with one action in \\\\boxed{}. " + self._status(), 0.0, False, False, {}
        self.turn += 1
        self.jugs = self._apply(self.jugs, choice)
        if self.target in self.jugs:
            self.done = True
            return f"Done! {self._status()}", 1.0, True, False, {}
        if self.turn >= self.max_turns:
            self.done = True
            return f"Out of turns. {self.solution()}", 0.0, False, True, {}
        return f"You chose {choice}. {self._status()}", 0.0, False, False, {}

    def solution(self):
        return " ".join("\\\\boxed{" + a + "}" for a in self._plan(self.jugs) or [])

    def close(self):
        pass
'''

DEFAULT_TOOL_USE_EXAMPLE = '''\
class LibraryLoanEnv(ToolUseEnv):
    def reset(self, seed=None):
        rng = random.Random(seed)
        titles = rng.sample(["Dune", "Emma", "Ulysses", "Beloved", "Rebecca", "Middlemarch"], 4)
        self._state = {"books": {f"B{rng.randint(100, 999)}{i}": t for i, t in enumerate(titles)},
                       "loans": {}}
        self.member = f"M{rng.randint(1000, 9999)}"
        self.wanted = rng.choice(titles)
        self._tools = {
            "search": {"description": "Find a book id by title", "parameters": {
                "type": "object", "properties": {"title": {"type": "string"}},
                "required": ["title"]}},
            "lend": {"description": "Lend a book to a member", "parameters": {
                "type": "object", "properties": {"book_id": {"type": "string"},
                                                 "member": {"type": "string"}},
                "required": ["book_id", "member"]}},
        }
        self._expected_answer = None
        self._user_messages = [f"Please lend '{self.wanted}' to member {self.member}."]
        self._message_criteria = [lambda s: self.member in s["loans"].values()
                                  and self._id(self.wanted) in s["loans"]]
        return self.task_observation(f"USER: {self._user_messages[0]}"), {}

    def _id(self, title):
        return next((b for b, t in self._state["books"].items() if t == title), None)

    def tool_search(self, title):
        book_id = self._id(str(title).strip())
        return f"id: {book_id}" if book_id else "no such title"

    def tool_lend(self, book_id, member):
        if book_id not in self._state["books"]:
            return "unknown book id"
        self._state["loans"][book_id] = member
        return "lent"

    def solution(self):
        book_id = self._id(self.wanted)
        return ('<tool_call>{"name": "search", "arguments": {"title": "' + self.wanted + '"}}'
                '</tool_call> <tool_call>{"name": "lend", "arguments": {"book_id": "' + book_id
                + '", "member": "' + self.member + '"}}</tool_call>')
'''

GAME_DESIGN_RULES = """\
DESIGN RULES
- The game has state (positions, resources, revealed facts, ...) and every valid action \
changes it.
- Each turn offers at least two meaningfully different actions; some are clearly better \
than others.
- Random play must lose almost always; optimal play must win in about {lo} to {hi} turns \
(the game is played for at most {max_turns} turns).
- There is a clear win condition and, ideally, a way to lose.
- Never put the answer, the solution or the hidden state into an observation; feedback may \
guide but must not reveal.
- Avoid: guess-and-retry puzzles, counting a value up to a target, a single obvious action, \
games solved in 1-3 turns, single-step questions dressed up as a game.
- Actions arrive as \\boxed{{<action>}} (the player's reply reduced to its boxed action) or, \
when the reply boxes nothing, as its full text. If there is no \\boxed{{...}}, reply with a \
format reminder and do not end the game. List the available actions in every \
observation, together with the progress (e.g. "Turn 3/{max_turns}").
- Rewards: win -> 1.0 and terminated=True; loss -> 0.0 and terminated=True; every other \
step -> 0.0; out of turns -> 0.0 and truncated=True."""

TOOL_USE_DESIGN_RULES = """\
DESIGN RULES
- The task needs several tool calls whose results feed each other (about {lo} to {hi} of \
the {max_turns} turns); a single call or a blind guess must not succeed.
- Offer at least two tools that are relevant and one that is plausible but not needed.
- Tool results are the only way to learn the hidden values; the first observation states \
the task but never the values the agent must discover.
- Finish either with <answer>...</answer> checked against self._expected_answer, or with \
user messages whose criteria (callables over self._state) become true in order.
- Tools validate their arguments and return helpful error strings instead of raising."""

ROBUSTNESS_RULES = """\
ROBUSTNESS RULES
- Standard library only (random, re, math, itertools, collections, ...); no files, \
network, input(), exec/eval, threads or subprocesses.
- Every path through step() returns the 5-tuple (str, float, bool, bool, dict); info is {}.
- Initialise all state in reset(); __init__ calls reset() so that the object is usable at \
once.
- Never assign self.solution (it would shadow the method); compute the solution from the \
generated state.
- No backslashes inside f-string expressions; double the braces of literal {} in f-strings.
- Guard divisions and indexing; no infinite loops (bounded retries when generating a \
solvable instance)."""

GROUNDING_INSTRUCTION = (
    "Pick one concept, mechanism or procedure from the reference document above and turn "
    "it into the interactive environment. The environment must stand on its own: never "
    "mention, quote or refer to the document."
)

ANSWER_FORMAT = (
    "Answer with exactly one ```python code block containing the complete environment, "
    "and nothing else."
)


def _class_name(code: str) -> str:
    match = re.search(r"^class\s+(\w+Env)\b", code, re.MULTILINE)
    return match.group(1) if match else "UnknownEnv"


def memory_block(
    positives: Sequence[MemoryRecord], negatives: Sequence[MemoryRecord]
) -> str | None:
    """The ``<REFERENCE_ENVIRONMENTS>`` block (<= 2 positives, <= 1 negative), or None."""
    parts = []
    if positives:
        examples = [
            f"### Example {i} (skill: {r.skill}, win_rate: {r.win_rate:.2f}, "
            f"regret: {r.regret:.2f})\n```python\n{r.code[:MEMORY_CODE_CHARS]}\n```"
            for i, r in enumerate(positives[:2], 1)
        ]
        parts.append(
            "<REFERENCE_ENVIRONMENTS>\nPast environments that were well calibrated for the "
            "player (neither trivial nor impossible, and the hint helped). Learn from their "
            "structure and difficulty, but design a DIFFERENT game:\n\n"
            + "\n\n".join(examples)
            + "\n</REFERENCE_ENVIRONMENTS>"
        )
    if negatives:
        r = negatives[0]
        verdict = "too easy" if r.win_rate > 0.5 else "too hard"
        parts.append(
            "Do not make environments like this one:\n"
            f"- {verdict} (win_rate={r.win_rate:.2f}): class {_class_name(r.code)}"
        )
    return "\n\n".join(parts) if parts else None


def designer_messages(
    skill: str,
    *,
    game_type: GameType = GameType.GAME,
    skill_description: str | None = None,
    difficulty: str = "medium",
    max_turns: int = 25,
    example_code: str | None = None,
    document: str | None = None,
    memory: MemoryExamples | None = None,
) -> list[dict[str, str]]:
    """Chat messages asking the Designer for one environment.

    ``document`` None means grounding off (no document block); ``memory`` None or empty
    means no memory block. ``skill_description`` defaults to `SKILLS` / `TOOL_USE_SKILLS`;
    ``example_code`` to the built-in example of the game type.
    """
    if difficulty not in DIFFICULTY_MIN_STEPS:
        raise ValueError(f"difficulty {difficulty!r} is not one of {tuple(DIFFICULTY_MIN_STEPS)}")
    known = game_type.skills
    description = skill_description or known.get(skill)
    if description is None:
        raise ValueError(
            f"unknown {game_type} skill {skill!r}: pass skill_description or use one of "
            f"{sorted(known)}"
        )
    rules, skeleton, kind = game_type.design_rules, game_type.skeleton, game_type.kind
    example = example_code or game_type.default_example
    sections = []
    if document is not None:
        sections.append(
            "You are given a reference document.\n<REFERENCE_DOCUMENT>\n"
            f"{document}\n</REFERENCE_DOCUMENT>\n{GROUNDING_INSTRUCTION}"
        )
    sections += [
        f"Write a {kind} that trains the skill {skill.replace('_', ' ')}: {description}.\n"
        f"Difficulty: {difficulty} - winning needs at least {DIFFICULTY_MIN_STEPS[difficulty]} "
        f"dependent reasoning steps. The environment is played for at most {max_turns} turns.",
        rules.format(lo=max_turns // 2, hi=3 * max_turns // 4, max_turns=max_turns),
        f"INTERFACE\n```python\n{skeleton}```",
        f"A SHORT WORKED EXAMPLE (a different skill; do not copy it)\n```python\n"
        f"{example.rstrip()}\n```",
        ROBUSTNESS_RULES,
    ]
    block = memory_block(memory.positives, memory.negatives) if memory else None
    if block:
        sections.append(block)
    sections.append(ANSWER_FORMAT)
    system = game_type.designer_system_prompt
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": "\n\n".join(sections)},
    ]


def worked_example(
    seed_envs: Iterable[Any], game_type: GameType = GameType.GAME,
    exclude_skill: str | None = None,
) -> str | None:
    """Code of the shortest seed environment of ``game_type`` (None if there is none).

    ``seed_envs`` are objects with ``name``, ``skill``, ``code`` and ``is_tool_use``
    (``spade_jax.envs.seeds.SeedEnv``). Seeds of ``exclude_skill`` are avoided when another
    one exists, so that the example does not prime the target skill. Deterministic.
    """
    tool_use = game_type.is_tool_use
    candidates = [e for e in seed_envs if bool(getattr(e, "is_tool_use", False)) == tool_use]
    preferred = [e for e in candidates if e.skill != exclude_skill] or candidates
    if not preferred:
        return None
    return min(preferred, key=lambda e: (len(e.code), e.name)).code


GAME_AGENT_SYSTEM_PROMPT = (
    "You are playing an interactive text game over several turns. Read each observation "
    "carefully, think step by step, then choose one action. Put your action inside "
    "\\boxed{...} at the end of your reply, exactly as the game lists it; the game receives "
    "only the first \\boxed{}, so write it once."
)

TOOL_USE_AGENT_SYSTEM_PROMPT = (
    "You are an agent completing a task with tools over several turns. Call a tool with "
    '<tool_call>{"name": "TOOL", "arguments": {...}}</tool_call> and read its result in the '
    "next observation. Discover values with the tools instead of guessing them. When the task "
    "asks for an answer, reply with <answer>...</answer> once you are sure."
)


GAME_HINT_SYSTEM_PROMPT = """\
You read the source code of a text game and write a hint for a player who cannot see the \
code. The player only sees text observations and answers with \\boxed{action}; your hint \
is added to the first observation.

Work out what the player faces, how the winning moves follow from what the player can \
see, and what format the actions take. Then write the hint:
- 1 to 3 sentences, under 100 words;
- the key insight or strategy for THIS game, and the expected action format;
- only refer to what the player can see, never to variables or code;
- do NOT give the answer, the solution sequence or any hidden value.

Reply with the hint text only: no preamble, no labels, no markdown."""

TOOL_USE_HINT_SYSTEM_PROMPT = """\
You read the source code of a tool-use environment and write a strategy hint for an agent \
that cannot see the code; your hint is added to its first observation.

Describe the approach in terms of tool roles and the order of phases (which tool's result \
feeds which), and tell the agent to discover the values with the tools. Rules:
- 1 to 3 sentences, under 100 words;
- NEVER write concrete ids, names, paths, amounts or answers from the code or its state; \
use placeholders such as <order_id>;
- never a filled-in call sequence the agent could copy.

Reply with the hint text only: no preamble, no labels, no markdown."""


def hint_messages(code: str, game_type: GameType = GameType.GAME) -> list[dict[str, str]]:
    """Messages for hint mode ``self``: the policy reads ``code`` and writes a hint."""
    system = game_type.hint_system_prompt
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Environment code:\n```python\n{code}\n```"},
    ]
