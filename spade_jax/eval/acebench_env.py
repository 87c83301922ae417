"""ACEBench (English) item as an environment under our contract (self-contained env module).

This file is environment code (standard library only): `BOUND_KWARGS` names one item of the
user's ACEBench clone, bound by the host (`acebench.py`), and the environment plays and scores
it by ACEBench's rules (`model_eval/checker.py`, `eval_main.py`, `model_inference/...`):

- Normal and Special items ("single"): one reply. The prompt is ACEBench's system and user
  prompt (in one user message). The reply, after a reasoning model's `</think>`, is scored as
  ACEBench scores it: Normal decodes `[f(a=1), ...]` with every whitespace character removed
  and matches the calls against each possible answer (`normal_verdict`); Special looks for the
  phrases its prompt asks for, with the missing parameter names or the wrong values
  (`special_verdict`). A Normal multi-turn item is one turn of a conversation; its
  conversation-level score is the host's roll-up (`acebench.category_accuracy`).
- Agent items ("agent_multi_step", "agent_multi_turn"): ACEBench's dialogue loop of at most
  `max_dialog_turns` messages between the agent, the scenario's API instances ("execution")
  and, for multi-turn, a simulated user. The scenario classes are the clone's own source,
  passed in `scenario_sources` and executed here (so in the sandbox worker). Every observation
  of an Agent item says whom it is for (`info["to"]`, the protocol of
  `simulated_user.UserSimulatorRunner`, which plays the user): a multi-turn item's reset is
  ACEBench's opening question for the user, with the user's system prompt
  (`info["user_system_prompt"]`); an agent message that is not a call goes to the user, and
  the next `step` action is the user's reply. A multi-step item has no user: everything is for
  the agent. At the end the saved attributes of the API instances must match the possible
  answer (`agent_state_verdict`).
The reward is 1 when the item passes, else 0.
"""

import ast
import collections
import copy
import importlib.abc
import importlib.util
import inspect
import json
import re
import sys

BOUND_KWARGS: dict = {}

TO_AGENT, TO_USER = "agent", "user"  # info["to"]: whom an Agent item's observation is for
FINISH = "finish conversation"
USER_OPENING = "Is there anything you need help with today?"
# ACEBench's checker type names (model_eval/checker.py, PYTHON_TYPE_MAPPING); "enum" maps to a
# type no value has, as there, so enum values are accepted whenever their type matches.
TYPE_NAMES = {
    "string": str, "integer": int, "float": float, "boolean": bool, "array": list,
    "tuple": list, "dict": dict, "any": str, "list": list, "object": dict,
    "objectArray": list, "list(string)": list, "list(enum)": list, "int": int,
    "enum": enumerate, "number": int,
}
NESTED_TYPES = ("array", "tuple", "list(string)", "list(enum)", "object", "objectArray")
_STANDARDIZE = re.compile(r"[ \,\.\/\-\_\*\^]")
_NUMBERED = re.compile(r"_\d+$")


# -- decoding ------------------------------------------------------------------------------------

def final_answer(reply: str) -> str:
    """The reply after a reasoning model's last `</think>`, stripped (the reference's rule)."""
    return reply.split("</think>")[-1].strip()


def decode_calls(text: str) -> list:
    """ACEBench's `decode_ast`: `[f(a=1), g()]` as [{"f": {"a": 1}}, {"g": {}}]; raises if
    the text is not a list or tuple of calls."""
    body = ast.parse(text, mode="eval").body
    calls = []
    for element in body.elts:
        if not isinstance(element, ast.Call):
            raise ValueError(f"not a call: {ast.unparse(element)[:80]}")
        calls.append(_call_dict(element))
    return calls


def _call_dict(node: ast.Call) -> dict:
    return {_dotted_name(node.func): {kw.arg: _literal(kw.value) for kw in node.keywords}}


def _dotted_name(node) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _literal(node):
    """A keyword argument's value as ACEBench resolves it (names as their text, calls without
    keywords as {name: {}}, arithmetic evaluated)."""
    if isinstance(node, ast.Constant):
        return "..." if node.value is Ellipsis else node.value
    if isinstance(node, ast.UnaryOp):
        return -node.operand.value
    if isinstance(node, ast.List):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_literal(item) for item in node.elts)
    if isinstance(node, ast.Dict):
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    if isinstance(node, ast.BinOp):
        return _arithmetic(node)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call):
        return _call_dict(node) if node.keywords else {_dotted_name(node.func): {}}
    if isinstance(node, ast.Subscript):
        return ast.unparse(node.value) + "[" + ast.unparse(node.slice) + "]"
    raise ValueError(f"unsupported AST type: {type(node).__name__}")


def _arithmetic(node):
    """Numeric arithmetic of constants (ACEBench evaluates a BinOp argument)."""
    operators = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
                 ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b,
                 ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
                 ast.Pow: lambda a, b: a ** b}
    if isinstance(node, ast.BinOp) and type(node.op) in operators:
        return operators[type(node.op)](_arithmetic(node.left), _arithmetic(node.right))
    value = _literal(node)
    if not isinstance(value, (int, float, str)):
        raise ValueError("unsupported arithmetic operand")
    return value


# -- Normal scoring (model_eval/checker.py) ------------------------------------------------------

def standardize(text: str) -> str:
    """ACEBench's string normal form: no spaces or , . / - _ * ^, lower case, ' as "."""
    return _STANDARDIZE.sub("", text).lower().replace("'", '"')


def normal_verdict(reply: str, functions: list, ground_truth, category: str) -> dict:
    """{"valid", "error_type"} of a Normal reply against ACEBench's possible answer(s)."""
    text = "".join(final_answer(reply).split())
    try:
        calls = decode_calls(text)
    except Exception:  # ACEBench: "Invalid syntax. Failed to decode AST."
        return {"valid": False, "error_type": "wrong_output_format"}
    if not all(isinstance(call, dict) for call in calls):
        return {"valid": False, "error_type": "wrong_output_format"}
    answers = ground_truth if isinstance(ground_truth, list) else [ground_truth]
    first_error = ""
    for answer in answers:
        try:
            verdict = check_calls(functions, calls, answer, category)
        except Exception as error:  # where ACEBench's checker would crash: a failed item
            verdict = {"valid": False, "error_type": f"checker_error:{type(error).__name__}"}
        if verdict["valid"]:
            return {"valid": True, "error_type": ""}
        first_error = first_error or verdict["error_type"]
    return {"valid": False, "error_type": first_error}


def check_calls(functions: list, calls: list, answer: dict, category: str) -> dict:
    """ACEBench's `normal_checker`: the same functions, as often, and every expected call
    matched by a call of that name that passes `check_call`."""
    if len(calls) != len(answer):
        return _invalid("wrong functions number")
    expected = [{_NUMBERED.sub("", name): params} for name, params in answer.items()]
    called = collections.Counter(name for call in calls for name in call)
    wanted = collections.Counter(name for call in expected for name in call)
    if set(called) != set(wanted) or called != wanted:
        return _invalid("function_mismatch")
    for original_name, expected_call in zip(answer, expected, strict=True):
        description = _find_description(functions, original_name)
        name = next(iter(expected_call))
        verdicts = [check_call(description, call, expected_call, category)
                    for call in calls if next(iter(call)) == name]
        if not any(v["valid"] for v in verdicts):
            return verdicts[-1] if verdicts else _invalid("simple_function_checker:unclear")
    return {"valid": True, "error_type": ""}


def _find_description(functions, name):
    """The first function whose name is contained in `name` (ACEBench's `find_description`)."""
    if not isinstance(functions, list):
        return functions
    return next((f for f in functions if f["name"] in name), None)


def check_call(description: dict, call: dict, expected_call: dict, category: str) -> dict:
    """ACEBench's `simple_function_checker` for one call against one expected call."""
    expected = next(iter(expected_call.values()))
    arguments = next(iter(call.values()))
    parameters = description["parameters"]
    if arguments == {} and parameters == {}:
        return {"valid": True, "error_type": ""}
    if arguments == {} or parameters == {}:
        return _invalid("wrong_param")
    if expected == parameters["properties"]:
        return {"valid": True, "error_type": ""}
    if expected == {}:
        return _invalid("wrong_param")
    name = description["name"]
    if name not in call:
        return _invalid("wrong_function_name")
    arguments = call[name]
    properties = parameters["properties"]
    if any(required not in arguments for required in parameters["required"]):
        return _invalid("lack_args")
    for param, value in arguments.items():
        if param not in properties or param not in expected:
            return _invalid("addition_args")
        type_name = properties[param]["type"]
        wanted_type = TYPE_NAMES[type_name]
        nested_type = None
        if type_name in NESTED_TYPES:
            items = properties[param].get("items")
            if isinstance(items, dict) and "type" in items:
                nested_name = items["type"]
            else:
                nested_name = ("string" if "string" in type_name else
                               "enum" if "enum" in type_name else "dict")
            nested_type = TYPE_NAMES[nested_name]
        if type_name == "tuple" and type(value) is tuple:
            value = list(value)
        if type_name == "float" and type(value) is int:
            value = float(value)
        typed = check_type(value, expected[param], wanted_type, nested_type)
        if not typed["valid"]:
            return _invalid(typed["error_type"])
        if typed["is_variable"]:
            continue
        if wanted_type is dict:
            verdict = check_dict(value, expected[param])
        elif wanted_type is list and nested_type is dict:
            if type_name == "objectArray":  # ACEBench's own check crashes here
                return _invalid("checker_error:objectArray")
            verdict = check_dict_list(value, expected[param])
        elif wanted_type is str:
            verdict = check_string(value, expected[param], category)
        elif wanted_type is list:
            verdict = check_list(value, expected[param])
        else:
            continue
        if not verdict["valid"]:
            return verdict
    return {"valid": True, "error_type": ""}


def _answer_type(answer):
    """The possible answer's type, None for "" (an optional parameter)."""
    return None if answer == "" else type(answer)


def check_type(value, answer, wanted_type, nested_type) -> dict:
    """ACEBench's `type_checker`: {"valid", "is_variable", "error_type"}. `is_variable` (the
    answer's type differs from the declared one) skips the value comparison."""
    answer_type = _answer_type(answer)
    is_variable = answer_type is not None and answer_type != wanted_type
    if value == "true":
        value = True
    if value == "false":
        value = False
    valid = True
    if type(value) == wanted_type:  # noqa: E721 - exact type, as ACEBench
        if nested_type is None:
            return {"valid": True, "is_variable": is_variable, "error_type": ""}
        for candidate in answer:
            if type(candidate) is not list or all(
                    check_type(item, candidate, nested_type, None)["valid"] for item in value):
                return {"valid": True, "is_variable": is_variable, "error_type": ""}
        valid = False  # nested type failed; ACEBench still accepts the answer's own type below
    if answer_type is not None and (type(value) == answer_type or answer == value):  # noqa: E721
        return {"valid": valid, "is_variable": True, "error_type": "" if valid else "type_error"}
    return {"valid": False, "is_variable": is_variable, "error_type": "type_error"}


def check_string(value: str, answer: str, category: str) -> dict:
    """Standardized answer contained in the standardized value (agent categories: equal)."""
    got, want = standardize(value), standardize(answer)
    ok = got == want if "agent" in category else want in got
    return {"valid": True, "error_type": ""} if ok else _invalid("value_error:string")


def check_list(value: list, answer: list) -> dict:
    """Equal lists after standardizing the strings in both."""
    def normal(items):
        return [standardize(item) if type(item) is str else item for item in items]
    if normal(list(value)) != normal(answer):
        return _invalid("value_error:list/tuple")
    return {"valid": True, "error_type": ""}


def check_dict(value, answer: dict) -> dict:
    """ACEBench's `dict_checker`: the same number of keys; each key expected; nested dicts
    recursively; otherwise the expected value's text contained in the value's text."""
    if not isinstance(value, dict) or len(value) != len(answer):
        return _invalid("value_error")
    for key, item in value.items():
        if item == "true":
            item = True
        if item == "false":
            item = False
        if key not in answer:
            return _invalid("value_error")
        wanted = answer[key]
        if isinstance(wanted, dict):
            verdict = check_dict(item, wanted)
            if not verdict["valid"]:
                return verdict
            continue
        got = standardize(item) if type(item) is str else item
        want = standardize(wanted) if type(wanted) is str else wanted
        if str(want) not in str(got):
            return _invalid("value_error")
    return {"valid": True, "error_type": ""}


def check_dict_list(value: list, answer: list) -> dict:
    """ACEBench's `list_dict_checker`: as many dicts, each passing `check_dict`."""
    if len(value) != len(answer):
        return _invalid("value_error:list_dict_count")
    for item, wanted in zip(value, answer, strict=True):
        verdict = check_dict(item, wanted)
        if not verdict["valid"]:
            return verdict
    return {"valid": True, "error_type": ""}


def _invalid(error_type: str) -> dict:
    return {"valid": False, "error_type": error_type}


# -- Special scoring (eval_main.special_eval) ----------------------------------------------------

def special_verdict(reply: str, ground_truth, category: str) -> dict:
    """Whether the reply flags the problem the way ACEBench's Special prompt asks: missing
    parameters (with the function and parameter names), incorrect values (with the values),
    or a request beyond the functions."""
    text = final_answer(reply)
    if "incomplete" in category:
        for name, values in ground_truth.items():
            if "Missing necessary parameters" not in text:
                return _invalid("error_detection")
            if name not in text or any(value not in text for value in values):
                return _invalid("error_correction")
    elif "error" in category:
        for values in ground_truth.values():
            if "There is incorrect value" not in text:
                return _invalid("error_detection")
            if any(value not in text for value in values):
                return _invalid("error_correction")
    elif "irrelevant" in category:
        if "the limitations of the function" not in text:
            return _invalid("error_detection")
    return {"valid": True, "error_type": ""}


# -- Agent: scenario classes and end state --------------------------------------------------------

class SourceModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import the clone's scenario modules from their source text ({dotted name: source});
    every prefix of a name is a package."""

    def __init__(self, sources: dict):
        self.sources = sources
        self.packages = {name.rsplit(".", i)[0] for name in sources
                         for i in range(1, name.count(".") + 1)}

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.sources:
            return importlib.util.spec_from_loader(fullname, self, is_package=False)
        if fullname in self.packages:
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        source = self.sources.get(module.__name__)
        if source is not None:
            exec(compile(source, module.__name__, "exec"), module.__dict__)  # noqa: S102


def install_sources(sources: dict) -> None:
    """Make the scenario modules importable in this process (once per set of names)."""
    if not any(isinstance(f, SourceModules) and f.sources == sources for f in sys.meta_path):
        sys.meta_path.insert(0, SourceModules(sources))


def snapshot(instances: dict, saved: dict) -> list:
    """ACEBench's end state: [{class: {attribute: value}}] of the saved attributes, through
    JSON as its result file stores them."""
    state = [{name: {key: value for key, value in vars(instance).items()
                     if key in saved[name]}}
             for name, instance in instances.items()]
    return json.loads(json.dumps(state, default=str))


def agent_state_verdict(state: list, ground_truth: list) -> dict:
    """ACEBench's `agent_eval` end-to-end check of the final state against the answer."""
    answers = ground_truth if isinstance(ground_truth, list) else [ground_truth]
    if len(answers) != len(state):
        return _invalid("wrong number of class")
    verdict = {"valid": True, "error_type": ""}
    for answer in answers:
        matched = next((item for item in state if set(item) == set(answer)), None)
        if matched is not None:  # as ACEBench, a class without a match is not a failure
            verdict = _state_check(matched, answer)
        if not verdict["valid"]:
            return verdict
    return verdict


def _state_check(item: dict, answer: dict) -> dict:
    """ACEBench's `agent_checker`: every saved attribute as the answer has it."""
    expected = next(iter(answer.values()))
    for key, value in next(iter(item.values())).items():
        if key not in expected:
            return _invalid("class attributes wrong")
        wanted = expected[key]
        if isinstance(wanted, dict):
            if any(k not in value or value[k] != v for k, v in wanted.items()):
                return _invalid("class attributes wrong")
        elif wanted != value:
            return _invalid("class attributes wrong")
    return {"valid": True, "error_type": ""}


def agent_calls(message: str, strict: bool = False) -> list:
    """The calls of an agent message as ACEBench's execution role reads them (brackets added
    where missing, then stripped); `strict`, as its agent role decides whether a message is a
    call, raises on a list element that is not a call."""
    text = message[1:] if message.startswith(" ") else message
    text = ("[" if not text.startswith("[") else "") + text
    text = text + ("]" if not text.endswith("]") else "")
    body = ast.parse(text.strip("[]'"), mode="eval").body
    if isinstance(body, ast.Call):
        return [_call_dict(body)]
    if isinstance(body, (ast.Tuple, ast.List)):
        if strict and not all(isinstance(e, ast.Call) for e in body.elts):
            raise ValueError("not a list of calls")
        return [_call_dict(e) for e in body.elts if isinstance(e, ast.Call)]
    return []


class ACEBenchEnv:
    """One ACEBench item; see the module docstring."""

    def __init__(self, max_turns: int = 1, **kwargs):
        kwargs = {**BOUND_KWARGS, **kwargs}
        self.max_turns = max_turns
        self.item_id = kwargs["item_id"]
        self.category = kwargs["category"]
        self.ground_truth = json.loads(kwargs["ground_truth_json"])
        self.kwargs = kwargs
        self.done = True

    # -- contract -------------------------------------------------------------------------------

    def reset(self, seed=None, options=None):
        """Start the item; the seed only labels the sample."""
        self.done = False
        info = {"item_id": self.item_id}
        if not self.category.startswith("agent"):
            return self.kwargs["prompt"], info
        self._start_agent()
        if self.category == "agent_multi_step":
            self.messages.append({"sender": "user", "recipient": "agent",
                                  "message": self.kwargs["question"]})
            return self._agent_prompt("user:" + self.kwargs["question"]), self._info()
        self.awaiting_user = True
        return USER_OPENING, self._info(to=TO_USER, user_system_prompt=self.kwargs[
            "user_prompt"].format(instruction=self.kwargs["question"]))

    def step(self, action):
        """Score a single reply, or play one agent (or simulated user) message."""
        if self.done:
            raise RuntimeError("call reset() before step()")
        if not self.category.startswith("agent"):
            self.done = True
            if self.category.startswith("special"):
                verdict = special_verdict(str(action), self.ground_truth, self.category)
            else:
                verdict = normal_verdict(str(action), json.loads(self.kwargs["functions_json"]),
                                         self.ground_truth, self.category)
            reward = 1.0 if verdict["valid"] else 0.0
            return "", reward, True, False, {"item_id": self.item_id, **verdict}
        if self.awaiting_user:
            return self._user_message(final_answer(str(action)))
        return self._agent_message(final_answer(str(action)))

    def close(self):
        """Nothing to release."""

    # -- agent dialogue -------------------------------------------------------------------------

    def _start_agent(self):
        install_sources(self.kwargs["scenario_sources"])
        config = self.kwargs["initial_config"]
        self.instances = {}
        for name in self.kwargs["involved_classes"]:
            module = importlib.import_module(self.kwargs["class_modules"][name])
            instance = getattr(module, name)()
            instance._load_scenario(copy.deepcopy(config.get(name, {})), long_context=False)
            instance._load_scenario(copy.deepcopy(config.get("BaseApi", {})), long_context=False)
            self.instances[name] = instance
        self.messages = []  # ACEBench's dialogue history after the opening message
        self.loop_index = 0  # its loop index: messages added so far
        self.executed = False  # whether any execution succeeded (else no end state is kept)
        self.milestones = []
        self.awaiting_user = False
        self.opened = False

    def _agent_prompt(self, history: str) -> str:
        """The first agent observation: ACEBench's agent prompts with the history so far."""
        return (self.kwargs["agent_system_prompt"] + "\n\n"
                + self.kwargs["agent_user_prompt"].format(functions=self.kwargs["functions"],
                                                          history=history + "\n"))

    def _add(self, sender, recipient, message) -> bool:
        """Add a message; True when ACEBench's loop ends after it."""
        self.messages.append({"sender": sender, "recipient": recipient, "message": message})
        index = self.loop_index
        self.loop_index += 1
        finished = index > 1 and FINISH in message
        return finished or self.loop_index >= self.kwargs["max_dialog_turns"]

    def _user_message(self, reply):
        self.awaiting_user = False
        if not self.opened:  # the opening message, before ACEBench's loop
            self.opened = True
            return self._agent_prompt("user:" + reply), 0.0, False, False, self._info()
        if self._add("user", "agent", reply):
            return self._finish()
        return "user:" + reply, 0.0, False, False, self._info()

    def _agent_message(self, message):
        multi_step = self.category == "agent_multi_step"
        if multi_step:
            to_execution = re.match(r"\[.*?\]", message) is not None
        else:
            to_execution = re.search(r"\[.*\]", message) is not None and _decodes(message)
        if self._add("agent", "execution" if to_execution else "user", message):
            return self._finish()
        if multi_step or to_execution:
            self.milestones.append(message)
            results = self._execute(message, multi_step)
            if self._add("execution", "agent", results):
                return self._finish()
            label = "execution result:" if multi_step else "execution:"
            return label + str(results), 0.0, False, False, self._info()
        self.awaiting_user = True
        return _without_role(message), 0.0, False, False, self._info(to=TO_USER)

    def _execute(self, message, multi_step):
        """Run the message's calls on the scenario instances; ACEBench's parsed results."""
        try:
            calls = [(name, arguments) for call in agent_calls(message)
                     for name, arguments in call.items()]
        except Exception:  # (multi-step only: a multi-turn message here has decoded)
            return ("Please do not ask me any questions, use the known conditions to solve "
                    "the problem")
        owners = collections.defaultdict(list)
        for instance in self.instances.values():
            for name, _ in inspect.getmembers(instance, inspect.ismethod):
                if not name.startswith("_"):
                    owners[name].append(instance)
        results = []
        for name, arguments in calls:
            try:
                if not owners.get(name):
                    raise NameError(f"name '{name}' is not defined")
                for instance in owners[name]:  # every instance with the method, as ACEBench
                    result = getattr(instance, name)(**arguments)
                results.append(result)
            except Exception as error:
                if not multi_step:  # ACEBench's multi-turn executor returns this literal text
                    return ["Error during execution: {str(e)}"]
                results.append(f"Error during execution: {error}")
        self.executed = True
        return [_parsed(result) for result in results]

    def _finish(self):
        self.done = True
        state = snapshot(self.instances, self.kwargs["saved_attributes"]) if self.executed else []
        verdict = agent_state_verdict(state, self.ground_truth)
        reward = 1.0 if verdict["valid"] else 0.0
        return "", reward, True, False, self._info(**verdict, messages=self.loop_index)

    def _info(self, **extra):
        """The step's info: the item, for the agent unless `extra` says otherwise."""
        return {"item_id": self.item_id, "to": TO_AGENT, **extra}


def _decodes(message: str) -> bool:
    try:
        agent_calls(message, strict=True)
    except Exception:
        return False
    return True


def _without_role(text: str) -> str:
    for prefix in ("user:", "agent:"):
        if text.startswith(prefix):
            return text[len(prefix):]
    return text


def _parsed(result):
    """A call's result as ACEBench shows it: JSON text parsed back, other values as text."""
    if isinstance(result, dict):
        try:
            text = json.dumps(result)
        except (TypeError, ValueError):
            text = str(result)
    else:
        text = result if isinstance(result, str) else str(result)
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
