"""BFCL v4 multi-turn entry as an environment under our contract (self-contained env module).

This file is environment code: it imports only the standard library and `bfcl_eval`, because
its text (with `BOUND_KWARGS` naming the entry) is what a sandbox worker executes. The
backends `eval` model-written call strings, so model output must be played in the sandbox.

Protocol (BFCL's multi-turn prompting loop, `bfcl_eval/model_handler/base_handler.py`):
- first observation: instructions, the function docs (JSON schemas) and the first user turn;
- an action with one or more calls, as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
  blocks (a block may hold a JSON list of calls) or as BFCL's python syntax
  `[f(a=1), g(b='x')]`, is executed against the entry's
  backend instances (state carried across turns); the observation is the results;
- an action without calls (or an `<answer>...</answer>`) ends the user turn; the next user turn
  follows, with held-out functions injected at their turn (miss_func);
- more than BFCL's step limit in one turn fails the entry (force-quit);
- after the last turn the executed calls are scored by `bfcl_eval`'s `multi_turn_checker`
  (reward 1 valid / 0 invalid, terminated).
"""

import ast
import inspect
import json
import os
import re
import tempfile
import uuid

BOUND_KWARGS: dict = {}

BFCL_INSTALL = (
    "pip install --no-deps bfcl-eval && pip install filelock tenacity tree_sitter==0.21.3 "
    "tree-sitter-java==0.21.0 tree-sitter-javascript==0.21.4"
)

INSTRUCTIONS = (
    "You are an expert in composing functions. You are given a question and a set of possible "
    "functions. Based on the question, you will need to make one or more function/tool calls to "
    "achieve the purpose. If none of the functions can be used, point it out. If the given "
    "question lacks the parameters required by the function, also point it out.\n\n"
    "To call functions, write one block per call:\n"
    '<tool_call>{{"name": "function_name", "arguments": {{"param": "value"}}}}</tool_call>\n'
    "Several calls may also share one block as a JSON list. The results come back in "
    "<tool_response> blocks.\n\n"
    "At each turn, you should try your best to complete the tasks requested by the user within "
    "the current turn. Continue to output functions to call until you have fulfilled the user's "
    "request to the best of your ability. Once you have no more functions to call, reply without "
    "any tool call (you may summarise in <answer>...</answer>); the system will then consider the "
    "current turn complete and proceed to the next turn or task.\n\n"
    "Here is a list of functions in JSON format that you can invoke.\n{functions}\n"
)
HELD_OUT_FUNCTIONS = (
    "{functions}\nI have updated some more functions you can choose from. What about now?"
)

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")


def import_bfcl() -> dict:
    """Import the parts of `bfcl_eval` we use; results/lock files go to a temp dir."""
    os.environ.setdefault("BFCL_PROJECT_ROOT", os.path.join(tempfile.gettempdir(), "bfcl_root"))
    try:
        from bfcl_eval.constants import default_prompts
        from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
        from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
        from bfcl_eval.model_handler.utils import default_decode_execute_prompting
    except ImportError as error:
        raise ImportError(f"BFCL evaluation needs bfcl-eval: {BFCL_INSTALL}") from error
    return {
        "checker": multi_turn_checker,
        "utils": multi_turn_utils,
        "decode_python": default_decode_execute_prompting,
        "step_limit": default_prompts.MAXIMUM_STEP_LIMIT,
    }


def function_schemas(docs: list) -> str:
    """BFCL function docs as JSON schemas (BFCL's own type names mapped to JSON Schema)."""
    return json.dumps([_json_schema(doc) for doc in docs])


def tool_call_block(calls: list) -> str:
    """Format (name, arguments) calls as one `<tool_call>` block (a JSON list if several)."""
    payload = [{"name": name, "arguments": arguments} for name, arguments in calls]
    return "<tool_call>" + json.dumps(payload[0] if len(payload) == 1 else payload) + "</tool_call>"


def call_to_json(call: str, methods: dict) -> tuple:
    """Split a python call string `f(1, b='x')` into (name, keyword arguments).

    Positional arguments are named through the backend method's signature in `methods`.
    """
    node = ast.parse(call.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain function call: {call!r}")
    name = node.func.id
    arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
    if node.args:
        parameters = list(inspect.signature(methods[name]).parameters)
        for parameter, value in zip(parameters, node.args, strict=False):
            arguments[parameter] = ast.literal_eval(value)
    return name, arguments


class BFCLMultiTurnEnv:
    """One BFCL multi-turn entry; see the module docstring for the protocol."""

    def __init__(self, max_turns: int = 25, **kwargs):
        kwargs = {**BOUND_KWARGS, **kwargs}
        self.max_turns = max_turns
        self.entry = json.loads(kwargs["entry_json"])
        self.ground_truth = json.loads(kwargs["ground_truth_json"])
        self.category = self.entry["id"].rsplit("_", 1)[0]
        self.bfcl = import_bfcl()
        self.step_limit = kwargs.get("step_limit", self.bfcl["step_limit"])
        self.run_id = None

    # -- contract -----------------------------------------------------------------------------

    def reset(self, seed=None, options=None):
        """Start the conversation; the entry is fixed, so the seed changes nothing."""
        self._forget_backends()
        self.run_id = "spade_" + uuid.uuid4().hex
        self.turn = 0
        self.steps_in_turn = 0
        self.calls = [[] for _ in self.ground_truth]  # per turn, per step: executed call strings
        self.finished = False
        self.methods = self._execute([])[1]
        first = INSTRUCTIONS.format(functions=function_schemas(self.entry["function"]))
        return first + "\n" + self._user_message(0), {"entry_id": self.entry["id"], "turn": 0}

    def step(self, action):
        """Execute the action's calls, or end the user turn when it has none."""
        if self.finished:
            raise RuntimeError("step() after the episode ended; call reset()")
        calls, errors = self._parse_calls(str(action))
        if not calls and not errors:
            return self._end_turn()
        results = []
        if calls:
            outputs, self.methods = self._execute(calls)
            results = list(zip(calls, outputs, strict=True))
            self.calls[self.turn].append(calls)
        self.steps_in_turn += 1
        observation = "\n".join(
            [_tool_response(call.split("(", 1)[0], output) for call, output in results]
            + [_tool_response("error", error) for error in errors]
        )
        if self.steps_in_turn > self.step_limit:
            self.finished = True
            info = self._info(valid=False, error_type="multi_turn:force_terminated")
            return observation, 0.0, True, False, info
        return observation, 0.0, False, False, self._info()

    def solution(self):
        """Ground-truth action script, one action per block: each user turn's calls in one
        `<tool_call>` block (a JSON list, so a long turn stays within the step limit), then
        an `<answer>` that ends the turn."""
        actions = []
        for turn_calls in self.ground_truth:
            if turn_calls:
                calls = [call_to_json(call, self.methods) for call in turn_calls]
                actions.append(tool_call_block(calls))
            actions.append("<answer>Done with this request.</answer>")
        return "\n".join(actions)

    def hint(self):
        """The functions the ground truth calls, turn by turn (names only, no arguments)."""
        turns = []
        for index, turn_calls in enumerate(self.ground_truth):
            names = [c.split("(", 1)[0].strip() for c in turn_calls] or ["none (cannot be done)"]
            turns.append(f"turn {index + 1}: {', '.join(names)}")
        return "Functions to call per user turn: " + "; ".join(turns)

    def close(self):
        """Drop this episode's backend instances from bfcl_eval's module-level cache."""
        self._forget_backends()

    # -- internals ----------------------------------------------------------------------------

    def _user_message(self, turn):
        held_out = self.entry.get("missed_function", {}).get(str(turn))
        if held_out:
            return HELD_OUT_FUNCTIONS.format(functions=function_schemas(held_out))
        return "\n".join(message["content"] for message in self.entry["question"][turn])

    def _end_turn(self):
        self.turn += 1
        self.steps_in_turn = 0
        if self.turn < len(self.ground_truth):
            return self._user_message(self.turn), 0.0, False, False, self._info()
        self.finished = True
        verdict = self._score()
        reward = 1.0 if verdict["valid"] else 0.0
        return "", reward, True, False, self._info(**verdict)

    def _score(self):
        try:
            result = self.bfcl["checker"](
                self.calls, self.ground_truth, self.entry, self.category, self.run_id
            )
        except Exception as error:  # a checker crash is a failed entry, with its reason
            return {"valid": False, "error_type": f"checker_error: {type(error).__name__}"}
        finally:
            self._forget_backends()
        return {"valid": bool(result["valid"]), "error_type": result.get("error_type", "")}

    def _info(self, **extra):
        return {"entry_id": self.entry["id"], "turn": self.turn, **extra}

    def _execute(self, calls):
        outputs, instances = self.bfcl["utils"].execute_multi_turn_func_call(
            calls,
            self.entry["initial_config"],
            self.entry["involved_classes"],
            self.run_id,
            self.entry["id"],
            long_context="long_context" in self.category,
        )
        methods = {
            name: method
            for instance in instances.values()
            for name, method in inspect.getmembers(instance, inspect.ismethod)
            if not name.startswith("_")
        }
        return outputs, methods

    def _parse_calls(self, action):
        """Calls (python strings) and parse errors from `<tool_call>` blocks or python syntax."""
        blocks = _TOOL_CALL.findall(action)
        if not blocks:
            if "<answer>" in action:
                return [], []
            try:
                return list(self.bfcl["decode_python"](action)), []
            except Exception:  # not a call list: the agent is talking, so the turn ends
                return [], []
        calls, errors = [], []
        for block in blocks:
            try:
                calls += _json_calls_to_python(block)
            except (ValueError, TypeError) as error:
                errors.append(f"invalid tool call {block.strip()[:200]!r}: {error}")
        return calls, errors

    def _forget_backends(self):
        if self.run_id is None:
            return
        namespace = vars(self.bfcl["utils"])
        prefix = re.sub(r"[-./:]", "_", self.run_id)
        for key in [k for k in namespace if k.startswith(prefix)]:
            del namespace[key]


def _json_calls_to_python(block):
    """Python call strings from a block holding one JSON call or a JSON list of calls."""
    payload = json.loads(block)
    return [
        _json_call_to_python(call) for call in (payload if isinstance(payload, list) else [payload])
    ]


def _json_call_to_python(call):
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ValueError('expected {"name": ..., "arguments": {...}}')
    arguments = call.get("arguments", {})
    if isinstance(arguments, str):
        arguments = json.loads(arguments) if arguments.strip() else {}
    if not isinstance(arguments, dict):
        raise ValueError("arguments must be a JSON object")
    names = [call["name"], *arguments]
    if not all(_IDENTIFIER.match(name) for name in names):
        raise ValueError("function and argument names must be identifiers")
    rendered = ", ".join(f"{key}={value!r}" for key, value in arguments.items())
    return f"{call['name']}({rendered})"


def _tool_response(name, content):
    return "<tool_response>" + json.dumps({"name": name, "content": content}) + "</tool_response>"


_JSON_TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": "string"}


def _json_schema(doc):
    """Rename BFCL's python-flavoured type names to JSON Schema ones, recursively."""
    if isinstance(doc, dict):
        return {
            key: _JSON_TYPES.get(value, value)
            if key == "type" and isinstance(value, str)
            else _json_schema(value)
            for key, value in doc.items()
        }
    if isinstance(doc, list):
        return [_json_schema(item) for item in doc]
    return doc
