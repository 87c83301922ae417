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
   ``max_calls_per_step``, the observation says how many more were not run) is executed in
   order and the results become the observation, with
   ``info[TOOL_RESULTS] = True`` so that the host hands it to the model as the chat template's
   ``tool`` turn (other observations are user turns). An unknown tool gives reward 0.0 and lists
   the available tools; an exception inside a tool is caught and returned as the text
   ``"Error calling X: e"``.
3. Neither (or malformed JSON): a format error, reward -0.1, not terminated, with an observation
   that explains the format.

Every step counts as a turn; at ``max_turns`` the episode is truncated and the observation reveals
``solution()``. All observations are reduced to printable ASCII (``string.printable``), because the
host exposes environments as gymnasium ``Text`` spaces with that charset; a tool's output longer
than ``max_tool_output_chars`` is cut and marked ``...[truncated]``.

The call format is the one Qwen3's chat template teaches (``<tool_call>`` JSON blocks), so a model
with native tool calling needs no other instructions; ``reset``'s info carries ``get_tools()``
under ``"tools"`` so that the host can pass them to the template (``apply_chat_template(tools=)``).
The validation gate calls ``schema_problems()`` and ``reset_problems()`` (docs/DESIGN.md §4.4).
"""

import inspect
import json
import random
import re
import string

__all__ = ["TOOL_RESULTS", "ToolUseEnv", "ToolUseBaseEnv", "parse_tool_calls"]

TOOL_RESULTS = "tool_results"  # step info key: the observation holds the results of tool calls

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL | re.IGNORECASE)
_PRINTABLE = frozenset(string.printable)
_JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string",
               list: "array", dict: "object"}
_SCHEMA_TYPES = frozenset(("string", "integer", "number", "boolean", "array", "object", "null"))
_TOOL_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

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


def parse_tool_calls(text):
    """The ``(name, arguments)`` of every ``<tool_call>`` JSON block in ``text``, in order.

    Accepts ``"arguments"`` or ``"parameters"``, as an object or a JSON string of one (both
    occur in models' native output). Raises ValueError naming the block that is malformed.
    """
    calls = []
    for raw in _CALL_RE.findall(text):
        try:
            call = json.loads(raw.strip())
            name = call["name"]
            args = call.get("arguments", call.get("parameters", {})) or {}
            if isinstance(args, str):
                args = json.loads(args)
        except Exception as e:
            raise ValueError(f"bad tool call JSON {raw.strip()[:80]!r}: {e}") from None
        if not isinstance(name, str) or not isinstance(args, dict):
            raise ValueError(f"bad tool call {raw.strip()[:80]!r}: name must be a string and "
                             "arguments an object")
        calls.append((name, args))
    return calls


def _property_problem(tool, arg, schema):
    """Why one parameter's JSON schema is not usable, or None."""
    if not isinstance(schema, dict):
        return f"tool {tool!r}: parameter {arg!r} schema must be an object, got {schema!r:.60}"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if kind is not None and not all(k in _SCHEMA_TYPES for k in kinds):
        return f"tool {tool!r}: parameter {arg!r} has type {kind!r}, not a JSON schema type"
    return None


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
    max_tool_output_chars = 2000  # longer tool outputs are cut (marked "...[truncated]")
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
                return to_printable(obs), self._episode_info(info)
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
        return self.task_observation("Solve the task with the tools."), self._episode_info({})

    def _episode_info(self, info):
        """``reset``'s info plus the tool schemas (``"tools"``) for the host's chat template."""
        info = dict(info) if isinstance(info, dict) else {}
        try:
            info.setdefault("tools", self.get_tools())
        except Exception:  # broken schemas are rejected by schema_problems(), not here
            pass
        return info

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

    def schema_problems(self):
        """Why the tools' schemas are unusable (validation check T1); empty when they are fine.

        Each tool needs a name the chat templates accept, a string description, an ``object``
        parameters schema whose properties have JSON schema types and whose ``required``
        names are properties, and a ``tool_<name>`` method accepting those arguments.
        """
        try:
            specs = self._tool_specs()
        except Exception as e:
            return [f"the tool specs cannot be read: {e}"]
        if not specs:
            return ["the environment offers no tools"]
        out = []
        for name, spec in specs.items():
            if not isinstance(name, str) or not _TOOL_NAME_RE.match(name):
                out.append(f"tool name {name!r} is not an identifier")
                continue
            if not isinstance(spec.get("description", ""), str):
                out.append(f"tool {name!r}: description must be a string")
            params = spec.get("parameters") or {"type": "object", "properties": {}}
            props = params.get("properties", {}) if isinstance(params, dict) else None
            if not isinstance(params, dict) or params.get("type") != "object" or \
                    not isinstance(props, dict):
                out.append(f"tool {name!r}: parameters must be a JSON schema of type 'object' "
                           f"with a 'properties' object, got {params!r:.80}")
                continue
            out += [p for arg, schema in props.items()
                    if (p := _property_problem(name, arg, schema))]
            required = params.get("required", [])
            if not isinstance(required, list) or not set(required) <= set(props):
                out.append(f"tool {name!r}: required {required!r:.60} must list properties")
                continue
            fn = getattr(self, f"tool_{name}", None)
            if not callable(fn):
                out.append(f"tool {name!r} has no tool_{name} method")
                continue
            try:
                inspect.signature(fn).bind(**{arg: None for arg in required})
            except TypeError as e:
                out.append(f"tool_{name} does not accept the required arguments {required}: {e}")
        return out

    def reset_problems(self):
        """Message criteria that raise on the state ``reset`` built (validation check T2).

        A criterion that throws counts as unmet at play time, so its request could never be
        completed; the reference rejects such environments at reset.
        """
        out = []
        for i, crit in enumerate(self._message_criteria or ()):
            for check in crit if isinstance(crit, (list, tuple)) else [crit]:
                try:
                    check(self._state)
                except Exception as e:
                    out.append(f"message criterion {i} raises at reset: "
                               f"{type(e).__name__}: {e}")
        return out

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
            return to_printable(fn(**args), self.max_tool_output_chars)
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
        try:
            calls = parse_tool_calls(text)
        except ValueError as e:
            return self._finish(f"Format error: {e}. " + FORMAT_HELP,
                                self.format_error_reward, False, {"format_error": True})
        if not calls:
            return self._finish("Format error: no <tool_call> or <answer> found. " + FORMAT_HELP,
                                self.format_error_reward, False, {"format_error": True})
        parts, reward = [], 0.0
        for name, args in calls[: self.max_calls_per_step]:
            result = self._call_tool(name, args)
            if result is None:
                avail = ", ".join(self._tool_specs())
                result = f"Unknown tool '{name}'. Available tools: {avail}."
            parts.append(f"[{name}] {result}")
        if len(calls) > self.max_calls_per_step:
            parts.append(f"Only the first {self.max_calls_per_step} tool calls of a turn run; "
                         f"the other {len(calls) - self.max_calls_per_step} were not run.")
        new_msgs, all_done = self._advance_messages()
        if all_done:
            return self._finish("\n".join(parts) + "\nAll requests are complete.", 1.0, True)
        obs = "\n".join(parts + ([new_msgs] if new_msgs else []))
        return self._finish(obs + f"\n(turn {self.turn}/{self.max_turns})", reward, False,
                            {TOOL_RESULTS: True})


ToolUseBaseEnv = ToolUseEnv
