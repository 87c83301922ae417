"""BFCL v4 single-turn entry (non-live or live) as a one-step environment (self-contained module).

This file is environment code: standard library plus `bfcl_eval`. `BOUND_KWARGS` carries the
first observation `prompt` (instructions, function docs and the question, rendered by the
host), `entry_json` (the entry with its function docs as written, which the checker reads),
`possible_answer_json` (None for the relevance categories) and `category`. The agent's one
reply is decoded as BFCL's evaluator decodes a model result, then scored by its own rules:
- `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (a block may hold a JSON
  list) decode to BFCL's `[{name: {param: value}}]` as its function-calling handlers do; a
  reply without blocks is decoded by BFCL's prompting decoder (`[f(a=1)]` in the entry's
  language);
- irrelevance categories pass when nothing decodes to a call, `live_relevance` when something
  does (`eval_runner._evaluate_single_relevance_entry`);
- the others pass when the decoded calls satisfy `ast_checker` against the possible answers
  (`eval_runner._evaluate_single_ast_entry`).
The reward is 1 valid / 0 invalid; the episode ends after one reply.
"""

import importlib
import json
import os
import re
import sys
import tempfile
import types

BOUND_KWARGS: dict = {}

# The checker looks the model up in BFCL's model table (only to ask whether it renames dotted
# function names); the reference's handle, which keeps them (underscore_to_dot=False).
CHECKER_MODEL_HANDLE = "Qwen/Qwen3-4B-Instruct-2507-FC"
CHECKER_MODEL_NAME = CHECKER_MODEL_HANDLE.replace("/", "_")
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def import_bfcl_checker() -> dict:
    """The parts of `bfcl_eval` that decode and check single-turn results."""
    os.environ.setdefault("BFCL_PROJECT_ROOT", os.path.join(tempfile.gettempdir(), "bfcl_root"))
    _ensure_model_table()
    from bfcl_eval.constants.enums import Language, ReturnFormat
    from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    from bfcl_eval.model_handler.utils import default_decode_ast_prompting
    from bfcl_eval.utils import is_empty_output, is_function_calling_format_output, is_java, is_js

    return {"ast_checker": ast_checker, "decode_prompting": default_decode_ast_prompting,
            "is_empty": is_empty_output, "is_call_format": is_function_calling_format_output,
            "is_java": is_java, "is_js": is_js, "Language": Language,
            "ReturnFormat": ReturnFormat}


def _ensure_model_table():
    """Make `bfcl_eval.constants.model_config` importable. It imports every API client BFCL
    supports (anthropic, openai, ...), which a `--no-deps` install lacks; the AST checker only
    reads `underscore_to_dot` of our handle from it, so without them a table holding that
    entry (False, as in BFCL's own) stands in."""
    name = "bfcl_eval.constants.model_config"
    if name in sys.modules:
        return
    try:
        importlib.import_module(name)
    except ImportError:
        table = types.ModuleType(name)
        table.MODEL_CONFIG_MAPPING = {
            CHECKER_MODEL_HANDLE: types.SimpleNamespace(underscore_to_dot=False)}
        sys.modules[name] = table


def decode_reply(reply: str, return_format) -> list:
    """BFCL's decoded form `[{name: {param: value}}]` of a reply; ValueError if it has none."""
    blocks = _TOOL_CALL.findall(reply)
    if not blocks:
        bfcl = import_bfcl_checker()
        return bfcl["decode_prompting"](reply, return_format)
    decoded = []
    for block in blocks:
        payload = json.loads(block)
        for call in payload if isinstance(payload, list) else [payload]:
            if not isinstance(call, dict) or not isinstance(call.get("name"), str):
                raise ValueError('expected {"name": ..., "arguments": {...}}')
            arguments = call.get("arguments", {})
            if isinstance(arguments, str):
                arguments = json.loads(arguments) if arguments.strip() else {}
            decoded.append({call["name"]: arguments})
    return decoded


class BFCLSingleTurnEnv:
    """One BFCL single-turn entry: the question in, one reply out, scored by BFCL's checker."""

    def __init__(self, max_turns: int = 1, **kwargs):
        kwargs = {**BOUND_KWARGS, **kwargs}
        self.max_turns = max_turns
        self.prompt = kwargs["prompt"]
        self.entry = json.loads(kwargs["entry_json"])
        answer = kwargs.get("possible_answer_json")
        self.possible_answer = json.loads(answer) if answer is not None else None
        self.category = kwargs["category"]
        self.done = True

    def reset(self, seed=None, options=None):
        """Show the question; the entry is fixed, so the seed changes nothing."""
        self.done = False
        return self.prompt, {"entry_id": self.entry["id"]}

    def step(self, action):
        """Decode and score the reply; the episode ends."""
        if self.done:
            raise RuntimeError("call reset() before step()")
        self.done = True
        verdict = self.score(str(action))
        info = {"entry_id": self.entry["id"], **verdict}
        return "", 1.0 if verdict["valid"] else 0.0, True, False, info

    def score(self, reply: str) -> dict:
        """BFCL's verdict on `reply`: {"valid": bool, "error_type": str}."""
        bfcl = import_bfcl_checker()
        if bfcl["is_java"](self.category):
            language, return_format = bfcl["Language"].JAVA, bfcl["ReturnFormat"].JAVA
        elif bfcl["is_js"](self.category):
            language = bfcl["Language"].JAVASCRIPT
            return_format = bfcl["ReturnFormat"].JAVASCRIPT
        else:
            language, return_format = bfcl["Language"].PYTHON, bfcl["ReturnFormat"].PYTHON
        try:
            decoded = decode_reply(reply, return_format)
            decode_error = ""
        except Exception as error:  # BFCL counts an undecodable reply as "no call"
            decoded, decode_error = None, f"{type(error).__name__}: {error}"[:200]
        if "relevance" in self.category:  # irrelevance, live_irrelevance, live_relevance
            called = decoded is not None and not bfcl["is_empty"](decoded)
            valid = not called if "irrelevance" in self.category else called
            error = "" if valid else ("irrelevance_error:decoder_success" if called
                                      else "relevance_error:decoder_failed")
            return {"valid": valid, "error_type": error}
        if decoded is None:
            return {"valid": False, "error_type": "ast_decoder:decoder_failed",
                    "error": decode_error}
        if not bfcl["is_call_format"](decoded):
            return {"valid": False, "error_type": "ast_decoder:decoder_wrong_output_format"}
        try:
            result = bfcl["ast_checker"](self.entry["function"], decoded, self.possible_answer,
                                         language, self.category, CHECKER_MODEL_NAME)
        except Exception as error:  # a checker crash is a failed entry, with its reason
            return {"valid": False, "error_type": f"checker_error: {type(error).__name__}"}
        valid = bool(result["valid"])
        return {"valid": valid, "error_type": "" if valid else result.get("error_type", "")}

    def solution(self):
        """A reply for BFCL: the first possible value of every parameter in one tool call
        block (Java / JavaScript values as JSON text, which BFCL reads back for scalars,
        arrays and JavaScript objects but not Java collections); for the relevance
        categories a call or a refusal."""
        if self.possible_answer is None:
            if "irrelevance" in self.category:
                return "None of the given functions can be used for this request."
            name = self.entry["function"][0]["name"]
            return '<tool_call>{"name": ' + json.dumps(name) + ', "arguments": {}}</tool_call>'
        as_text = "java" in self.category or "javascript" in self.category
        calls = []
        for answer in self.possible_answer:
            for name, parameters in answer.items():
                arguments = _first_values(parameters)
                if as_text:  # Java / JavaScript arguments are their source text
                    arguments = {key: _source_text(value) for key, value in arguments.items()}
                calls.append({"name": name, "arguments": arguments})
        return "<tool_call>" + json.dumps(calls) + "</tool_call>"

    def close(self):
        """Nothing to release."""


def _first_values(parameters: dict) -> dict:
    """The first possible value of each parameter, recursively; "" (optional) ones left out."""
    chosen = {}
    for key, values in parameters.items():
        if not values or values[0] == "":
            continue
        first = values[0]
        chosen[key] = _first_values(first) if isinstance(first, dict) else first
    return chosen


def _source_text(value) -> str:
    """A value as Java / JavaScript source text (JSON spelling; strings as they are)."""
    return value if isinstance(value, str) else json.dumps(value)
