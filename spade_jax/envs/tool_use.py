"""ToolUseEnv: the base class of tool-use environments (stdlib only).

Compatible with the reference's ``ToolUseBaseEnv`` (spade-rl/spade,
``spade/core/envs/tool_use_base_env.py``; see docs/DESIGN.md §4.3).
This module is injected verbatim into the sandbox worker's namespace, so it imports nothing
outside the standard library and no other spade_jax module. Inside the sandbox the class is a
global name (``ToolUseEnv``, alias ``ToolUseBaseEnv``); environment code subclasses it without an
import.

A subclass, in ``reset(seed)``, sets:

* ``self._tools = {name: {"description": str, "parameters": <JSON schema object>}}``
  (or a class attribute ``tools`` with the same shape; when neither is given, the schemas are
  derived from the ``tool_<name>`` methods' signatures and docstrings);
* ``self._state``: any mutable state the tools read and write;
* ``self._expected_answer``: the answer that ``<answer>...</answer>`` is checked against by
  ``_check_answer`` (override it for custom comparisons), and/or
* ``self._user_messages`` + ``self._message_criteria``: a multi-message task. Message ``i`` is
  satisfied when ``_message_criteria[i]`` (a callable over ``_state``, or a list of them, all of
  which must hold) returns true; the next message is then shown. When the last message is
  satisfied the episode ends with reward 1.0, without an ``<answer>``.

and implements ``tool_<name>(self, **kwargs) -> str`` methods and ``solution()``.

``step(action)`` semantics (the action is the agent's raw text):

1. ``<answer>X</answer>`` is parsed first. Correct: reward 1.0, terminated. Wrong: reward 0.0 and,
   by default, terminated (``max_answer_attempts = 1``: one answer per episode, so guessing and
   retrying never pays); a subclass may allow more attempts, then a wrong answer is reported and
   the episode continues until the attempts are used up.
2. Otherwise every ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` block (at most
   ``max_calls_per_step``) is executed in order and the results become the observation. An
   unknown tool gives reward 0.0 and lists the available tools; an exception inside a tool is
   caught and returned as the text ``"Error calling X: e"``.
3. Neither (or malformed JSON): a format error, reward -0.1, not terminated, with an observation
   that explains the format.

Every step counts as a turn; at ``max_turns`` the episode is truncated and the observation reveals
``solution()``. All observations are reduced to printable ASCII (``string.printable``), because the
host exposes environments as gymnasium ``Text`` spaces with that charset.
"""

import inspect
import json
import random
import re
import string

__all__ = ["ToolUseEnv", "ToolUseBaseEnv"]

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL | re.IGNORECASE)
_PRINTABLE = frozenset(string.printable)
_JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string",
               list: "array", dict: "object"}

FORMAT_HELP = (
    "To call a tool reply with"
    ' <tool_call>{"name": "TOOL", "arguments": {"ARG": VALUE}}</tool_call>.'
    " When you know the answer reply with <answer>YOUR ANSWER</answer>."
)


def to_printable(text, limit=4000):
    """``str(text)`` reduced to printable ASCII (others become '?') and capped at ``limit``."""
    text = str(text)
    if len(text) > limit:
        text = text[:limit] + " ...[truncated]"
    return "".join(c if c in _PRINTABLE else "?" for c in text)


def _normalise(x):
    s = " ".join(str(x).strip().lower().split())
    return s.rstrip(".").strip().strip("\"'`").strip()


def _as_number(s):
    try:
        return float(s.replace(",", "").replace("$", ""))
    except ValueError:
        return None


class ToolUseEnv:
    """Base class for tool-use environments; see the module docstring for the contract."""

    tools = None                # optional class-level {name: {"description", "parameters"}}
    max_answer_attempts = 1     # wrong answers allowed before the episode ends (1 = one shot)
    max_calls_per_step = 4      # tool calls executed from one action
    format_error_reward = -0.1
    # Class-level defaults; a subclass may set them on the class or per episode in reset().
    _tools = None
    _expected_answer = None
    _user_messages = ()
    _message_criteria = ()

    def __init_subclass__(cls, **kwargs):
        """Wrap each subclass's own ``reset``: the episode bookkeeping always runs first and the
        first observation is printable ASCII, whether or not the subclass calls super().reset."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("reset")
        if own is None or getattr(own, "_tool_use_wrapped", False):
            return

        def reset(self, seed=None, *args, **kw):
            self._begin_episode(seed)
            out = own(self, seed, *args, **kw)
            if isinstance(out, tuple) and len(out) == 2:
                obs, info = out
                return to_printable(obs), (info if isinstance(info, dict) else {})
            return out

        reset._tool_use_wrapped = True
        reset.__doc__ = own.__doc__
        cls.reset = reset

    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = int(max_turns)
        if not hasattr(self, "_state"):
            self._state = {}
        self.reset()

    # ----- episode bookkeeping -------------------------------------------------------------
    def _begin_episode(self, seed):
        self.seed = seed
        self.rng = random.Random(seed)
        self.turn = 0
        self.done = False
        self._answer_attempts = 0
        self._current_msg = 0
        for name in ("_user_messages", "_message_criteria"):  # back to the class-level value
            self.__dict__.pop(name, None)

    def reset(self, seed=None):
        """Subclasses override this (calling ``super().reset(seed)`` is optional)."""
        self._begin_episode(seed)
        return self.task_observation("Solve the task with the tools."), {}

    def close(self):
        pass

    def solution(self):
        return ""

    def hint(self):
        return ""

    # ----- tool schemas ----------------------------------------------------------------------
    def _tool_specs(self):
        specs = getattr(self, "_tools", None) or self.tools
        if specs:
            return {n: dict(s or {}) for n, s in specs.items()}
        derived = {}
        for attr in sorted(dir(type(self))):
            if attr.startswith("tool_") and callable(getattr(self, attr, None)):
                derived[attr[5:]] = self._derive_spec(getattr(self, attr))
        return derived

    @staticmethod
    def _derive_spec(fn):
        props, required = {}, []
        for p in inspect.signature(fn).parameters.values():
            if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                continue
            props[p.name] = {"type": _JSON_TYPES.get(p.annotation, "string")}
            if p.default is p.empty:
                required.append(p.name)
        doc = (inspect.getdoc(fn) or "").strip().splitlines()
        return {"description": doc[0] if doc else "",
                "parameters": {"type": "object", "properties": props, "required": required}}

    def get_tools(self):
        """OpenAI-style function schemas, for ``apply_chat_template(tools=...)``."""
        out = []
        for name, spec in self._tool_specs().items():
            params = spec.get("parameters") or {"type": "object", "properties": {}}
            out.append({"type": "function", "function": {
                "name": name, "description": spec.get("description", ""), "parameters": params}})
        return out

    def tools_text(self):
        """One line per tool: ``name(arg: type, opt?: type) - description``."""
        lines = []
        for name, spec in self._tool_specs().items():
            params = spec.get("parameters") or {}
            req = set(params.get("required", []))
            args = ", ".join(
                f"{a}{'' if a in req else '?'}: {(s or {}).get('type', 'any')}"
                for a, s in (params.get("properties") or {}).items())
            lines.append(f"- {name}({args}) - {spec.get('description', '')}")
        return "\n".join(lines)

    def task_observation(self, task):
        """The first observation: task, tools, action format and the turn budget."""
        if self._user_messages and self._expected_answer is None:
            how = ('To call a tool reply with <tool_call>{"name": "TOOL", "arguments": '
                   '{"ARG": VALUE}}</tool_call>. The episode ends by itself when every request '
                   "is done; no <answer> is needed.")
        else:
            once = ("You may answer only once: a wrong answer ends the episode."
                    if self.max_answer_attempts <= 1 else
                    f"You may answer up to {self.max_answer_attempts} times.")
            how = f"{FORMAT_HELP}\n{once}"
        return (f"{task}\n\nTOOLS:\n{self.tools_text()}\n\n{how} "
                f"You have {self.max_turns} turns.")

    # ----- answers and messages --------------------------------------------------------------
    def _check_answer(self, answer):
        """Normalised comparison with ``_expected_answer`` (numbers compared numerically)."""
        expected = getattr(self, "_expected_answer", None)
        if expected is None:
            return bool(self._user_messages) and self._current_msg >= len(self._user_messages)
        if isinstance(expected, (list, tuple, set)):
            return any(self._same(answer, e) for e in expected)
        return self._same(answer, expected)

    @staticmethod
    def _same(answer, expected):
        a, e = _normalise(answer), _normalise(expected)
        if a == e:
            return True
        na, ne = _as_number(a), _as_number(e)
        return na is not None and ne is not None and abs(na - ne) <= 1e-6 * max(1.0, abs(ne))

    def _criterion_met(self, crit):
        crits = crit if isinstance(crit, (list, tuple)) else [crit]
        try:
            return all(bool(c(self._state)) for c in crits)
        except Exception:
            return False

    def _advance_messages(self):
        """Move past satisfied messages; returns (text of newly shown messages, all_done)."""
        msgs, crits = self._user_messages, self._message_criteria
        if not msgs:
            return "", False
        shown = []
        while self._current_msg < len(msgs) and self._current_msg < len(crits) and \
                self._criterion_met(crits[self._current_msg]):
            self._current_msg += 1
            if self._current_msg < len(msgs):
                shown.append(f"USER: {msgs[self._current_msg]}")
        return "\n".join(shown), self._current_msg >= len(msgs)

    # ----- stepping ----------------------------------------------------------------------------
    def _call_tool(self, name, args):
        fn = getattr(self, f"tool_{name}", None)
        if name not in self._tool_specs() or not callable(fn):
            return None
        try:
            return to_printable(fn(**args), 2000)
        except Exception as e:  # the agent sees the error and may retry
            return to_printable(f"Error calling {name}: {e}", 500)

    def _finish(self, obs, reward, terminated, info=None):
        truncated = False
        if terminated:
            self.done = True
        elif self.turn >= self.max_turns:
            self.done = True
            truncated = True
            obs += f"\nOut of turns. A solution was:\n{self.solution()}"
        return to_printable(obs), float(reward), bool(terminated), truncated, dict(info or {})

    def step(self, action):
        if getattr(self, "done", False):
            return "The episode is over; call reset().", 0.0, True, False, {}
        self.turn = getattr(self, "turn", 0) + 1
        text = action if isinstance(action, str) else str(action)
        answers = _ANSWER_RE.findall(text)
        if answers:
            self._answer_attempts = getattr(self, "_answer_attempts", 0) + 1
            if self._check_answer(answers[-1].strip()):
                return self._finish("Correct! Task complete.", 1.0, True)
            left = self.max_answer_attempts - self._answer_attempts
            if left <= 0:
                return self._finish("Wrong answer. The episode is over.", 0.0, True)
            return self._finish(f"Wrong answer. {left} attempt(s) left.", 0.0, False)
        blocks = _CALL_RE.findall(text)
        if not blocks:
            return self._finish("Format error: no <tool_call> or <answer> found. " + FORMAT_HELP,
                                self.format_error_reward, False, {"format_error": True})
        parts, reward = [], 0.0
        for raw in blocks[: self.max_calls_per_step]:
            try:
                call = json.loads(raw.strip())
                name = call["name"]
                args = call.get("arguments", call.get("parameters", {})) or {}
                if isinstance(args, str):
                    args = json.loads(args)
                if not isinstance(name, str) or not isinstance(args, dict):
                    raise ValueError("name must be a string and arguments an object")
            except Exception as e:
                return self._finish(f"Format error: bad tool call JSON ({e}). " + FORMAT_HELP,
                                    self.format_error_reward, False, {"format_error": True})
            result = self._call_tool(name, args)
            if result is None:
                avail = ", ".join(self._tool_specs())
                result = f"Unknown tool '{name}'. Available tools: {avail}."
            parts.append(f"[{name}] {result}")
        new_msgs, all_done = self._advance_messages()
        if all_done:
            return self._finish("\n".join(parts) + "\nAll requests are complete.", 1.0, True)
        obs = "\n".join(parts + ([new_msgs] if new_msgs else []))
        return self._finish(obs + f"\n(turn {self.turn}/{self.max_turns})", reward, False)


ToolUseBaseEnv = ToolUseEnv
