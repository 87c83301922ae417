"""One τ²-bench task as an environment under our contract, with two speakers (self-contained).

This file is environment code: it imports the standard library and, from the user's clone of
tau2-bench (`tau2_root`, its `src/` and `data/`), the domain's `get_environment()` (tools,
database, policy) without running `tau2/__init__.py`, which would pull in the LLM clients.
`BOUND_KWARGS` names the clone, the domain, the task (tasks.json's object) and the limits.

Protocol. τ² is a conversation of three parties: the agent (the policy played by the rollout),
a simulated user (a second model; `simulated_user.UserSimulatorRunner` plays it) and the
domain's tools. Every observation says whom it is for in `info["to"]`:
- "user": text for the simulated user (the agent's message, or the results of the user's own
  tool calls, `info["tool_results"]`); the next action is the user's reply;
- "agent": text for the agent (the user's message, or its tool results); the next action is
  the agent's.
`reset` returns the agent's fixed greeting for the user, with the user's system prompt and
tools (`info["user_system_prompt"]`, `info["user_tools"]`) and the agent's
(`info["agent_system_prompt"]`, `info["tools"]`).

A message holds text or `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks,
not both (τ²'s rule; `<think>` blocks are dropped first); an empty or mixed message ends the
episode with reward 0, as do `max_steps` messages or `max_errors` failed tool calls. The user
ends the conversation with ###STOP###, ###TRANSFER### or ###OUT-OF-SCOPE###; the episode is
then scored as τ²'s evaluator does, the product over the task's `reward_basis` of: DB (the
agent's and user's database hashes equal those after replaying the gold actions on a fresh
environment), ENV_ASSERTION (each assertion holds on the final environment), ACTION (each gold
action matches a call made, on its `compare_args`), COMMUNICATE (each `communicate_info` string
appears in an agent message, case-folded, commas removed) and NL_ASSERTION (a judge model,
shown τ²'s judge prompt with the conversation and the task's assertions, says every one is
met). For the last, the observation after the user's stop is the judge's prompt (`info["to"]
== "judge"`, its system prompt in `info["judge_system_prompt"]`) and the next action its
verdict: JSON `{"results": [{"metExpectation": true|false, ...}, ...]}`, read from the first
`{` to the last `}` (an unreadable verdict fails the assertions).
"""

import copy
import importlib
import json
import os
import re
import sys
import textwrap
import types

BOUND_KWARGS: dict = {}

FIRST_AGENT_MESSAGE = "Hi! How can I help you today?"  # τ²'s orchestrator opens with this
USER_STOP_TOKENS = ("###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###")
AGENT_INSTRUCTION = (
    "You are a customer service agent that helps the user according to the <policy> provided "
    "below.\nIn each turn you can either:\n- Send a message to the user.\n- Make a tool call.\n"
    "You cannot do both at the same time.\n\nTry to be helpful and always follow the policy. "
    "Always make sure you generate valid JSON only."
)
AGENT_SYSTEM_PROMPT = (
    "<instructions>\n{instruction}\n</instructions>\n<policy>\n{policy}\n</policy>")
USER_SYSTEM_PROMPT = "{guidelines}\n\n<scenario>\n{scenario}\n</scenario>"
USER_GUIDELINES = "data/tau2/user_simulator/simulation_guidelines{suffix}.md"
PERSONA_PLACEHOLDER = "<PERSONA_GUIDELINES>"
# τ²'s NL-assertion judge (evaluator_nl_assertions.py), its prompts' text
JUDGE_SYSTEM_PROMPT = """TASK
- You will be given a list of expected outcomes and a conversation that was collected during \
a test case run.
- The conversation is between an agent and a customer.
- Your job is to evaluate whether the agent satisfies each of the expected outcomes.
- Grade each expected outcome individually.

FORMAT
- Your response should be a JSON object with the following fields:
- `reasoning`: a short explanation for your classification
- `metExpectation`: `true` if the agent satisfies the expected outcomes, `false` otherwise
- `expectedOutcome`: repeat the expectation from the input that you are grading

Example response structure:
{
    "results": [
        {
            "expectedOutcome": "<one of the expected outcomes from the input>",
            "reasoning": "<reasoning trace>",
            "metExpectation": <false or true>,
        }
    ]
}"""
JUDGE_USER_PROMPT = "conversation:\n{conversation}\n\nexpectedOutcomes:\n{assertions}"
DEFAULT_MAX_STEPS = 200
DEFAULT_MAX_ERRORS = 10  # τ²'s orchestrator default
TOOL_RESULTS = "tool_results"  # the host's `envs.tool_use.TOOL_RESULTS`: a tool turn

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def import_domain(tau2_root, domain):
    """The `tau2.domains.<domain>.environment` module of the clone at `tau2_root`.

    `tau2` is registered as a bare package over `<root>/src/tau2` so its `__init__` (the
    runner and LLM clients) is skipped; the domain modules need only pydantic and the small
    packages of tau2-bench's own requirements (addict, loguru, deepdiff, python-dotenv).
    """
    source = os.path.join(tau2_root, "src", "tau2")
    if not os.path.isdir(source):
        raise FileNotFoundError(f"no tau2-bench sources at {source}")
    package = sys.modules.get("tau2")
    if package is None or list(getattr(package, "__path__", [])) != [source]:
        for name in [n for n in sys.modules if n == "tau2" or n.startswith("tau2.")]:
            del sys.modules[name]
        package = types.ModuleType("tau2")
        package.__path__ = [source]
        sys.modules["tau2"] = package
    return importlib.import_module(f"tau2.domains.{domain}.environment")


def scenario_text(user_scenario):
    """The user's scenario as τ² renders it (`UserScenario.__str__`): persona, instructions."""
    instructions = user_scenario["instructions"]
    if isinstance(instructions, dict):
        parts = [f"Domain: {instructions['domain']}",
                 "Reason for call:\n" + textwrap.indent(instructions["reason_for_call"], "\t")]
        for key, title in (("known_info", "Known info"), ("unknown_info", "Unknown info")):
            if instructions.get(key) is not None:
                parts.append(f"{title}:\n" + textwrap.indent(instructions[key], "\t"))
        parts.append("Task instructions:\n"
                     + textwrap.indent(instructions["task_instructions"], "\t"))
        instructions = "\n".join(parts)
    lines = []
    if user_scenario.get("persona") is not None:
        lines += ["Persona:", textwrap.indent(user_scenario["persona"], "\t")]
    lines += ["Instructions:", textwrap.indent(str(instructions), "\t")]
    return "\n".join(lines)


def parse_message(text):
    """(tool calls [(name, arguments)], text content, error or "") of one message."""
    text = _THINK.sub("", str(text))
    blocks = _TOOL_CALL.findall(text)
    content = _TOOL_CALL.sub("", text).strip()
    if not blocks:
        return [], content, "" if content else "empty message"
    if content:
        return [], content, "a message may hold text or tool calls, not both"
    calls = []
    for block in blocks:
        try:
            payload = json.loads(block)
        except json.JSONDecodeError as error:
            return [], "", f"invalid tool call JSON {block.strip()[:200]!r}: {error}"
        for call in payload if isinstance(payload, list) else [payload]:
            arguments = call.get("arguments", {}) if isinstance(call, dict) else None
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments) if arguments.strip() else {}
                except json.JSONDecodeError as error:
                    return [], "", f"invalid tool arguments {arguments[:200]!r}: {error}"
            if not isinstance(call, dict) or not isinstance(call.get("name"), str) \
                    or not isinstance(arguments, dict):
                return [], "", 'a tool call is {"name": ..., "arguments": {...}}'
            calls.append((call["name"], arguments))
    return calls, "", ""


def action_matches(action, name, arguments):
    """Whether a call (name, arguments) matches a gold action, as τ²'s `compare_with_tool_call`:
    same name and equal values on `compare_args` (all of the call's arguments when None)."""
    if action["name"] != name:
        return False
    keys = action.get("compare_args")
    keys = list(arguments) if keys is None else keys
    return ({k: v for k, v in arguments.items() if k in keys}
            == {k: v for k, v in action.get("arguments", {}).items() if k in keys})


def judged_met(verdict):
    """Whether a judge's verdict says every assertion is met (τ²: all of its "results"; an
    unreadable verdict: False)."""
    text = _THINK.sub("", str(verdict))
    try:
        results = json.loads(text[text.index("{"):text.rindex("}") + 1])["results"]
        return all(bool(result["metExpectation"]) for result in results)
    except (ValueError, KeyError, TypeError):
        return False


def communicated(info, agent_messages):
    """Whether `info` appears in an agent message (case-folded, commas removed), as τ²."""
    return any(info.lower() in message.lower().replace(",", "") for message in agent_messages)


class Tau2Env:
    """One τ²-bench task; see the module docstring for the protocol and the scoring."""

    def __init__(self, max_turns=DEFAULT_MAX_STEPS, **kwargs):
        kwargs = {**BOUND_KWARGS, **kwargs}
        self.max_turns = max_turns
        self.tau2_root = kwargs["tau2_root"]
        self.domain = kwargs["domain"]
        self.task = json.loads(kwargs["task_json"])
        self.max_steps = int(kwargs.get("max_steps", DEFAULT_MAX_STEPS))
        self.max_errors = int(kwargs.get("max_errors", DEFAULT_MAX_ERRORS))
        self.module = import_domain(self.tau2_root, self.domain)
        initial = self.task.get("initial_state") or {}
        if initial.get("message_history"):
            raise ValueError(f"task {self.task['id']}: an initial message history is not "
                             "supported")

    # -- contract -----------------------------------------------------------------------------

    def reset(self, seed=None, options=None):
        """A fresh environment in the task's initial state; the greeting, to the user."""
        self.environment = self._fresh_environment()
        self.calls = []  # (requestor, name, arguments) of every tool call made
        self.agent_messages = []
        self.trajectory = [("assistant", FIRST_AGENT_MESSAGE)]  # (role, content) as τ² logs
        self.pending_score = None  # (reward, breakdown) while the judge is asked
        self.steps = 1  # the greeting
        self.errors = 0
        self.finished = False
        self.to = "user"
        user_tools = self._user_tools()
        guidelines = self._read(USER_GUIDELINES.format(suffix="_tools" if user_tools else ""))
        info = {
            "to": "user",
            "task_id": self.task["id"],
            "agent_system_prompt": AGENT_SYSTEM_PROMPT.format(
                instruction=AGENT_INSTRUCTION, policy=self.environment.get_policy()),
            "tools": [_schema(tool) for tool in self.environment.get_tools()],
            "user_system_prompt": USER_SYSTEM_PROMPT.format(
                guidelines=guidelines.replace(PERSONA_PLACEHOLDER, ""),
                scenario=scenario_text(self.task["user_scenario"])),
            "user_tools": [_schema(tool) for tool in user_tools] or None,
        }
        return FIRST_AGENT_MESSAGE, info

    def step(self, action):
        """The message of whoever `info["to"]` of the last observation named."""
        if self.finished:
            raise RuntimeError("step() after the episode ended; call reset()")
        if self.to == "judge":
            return self._judged(action)
        speaker = "assistant" if self.to == "agent" else "user"
        self.steps += 1
        calls, content, error = parse_message(action)
        if error:
            return self._end(f"{'agent' if speaker == 'assistant' else 'user'}_error: {error}")
        self.trajectory.append((speaker, None if calls else content))
        if calls:
            results = [self._call(speaker, name, arguments) for name, arguments in calls]
            self.trajectory += [("tool", output) for output in results]
            self.steps += 1
            if self.errors >= self.max_errors:
                return self._end("too_many_errors")
            if self.steps >= self.max_steps:
                return self._end("max_steps")
            observation = "\n".join(_tool_response(name, output)
                                    for (name, _), output in zip(calls, results, strict=True))
            return observation, 0.0, False, False, self._info(**{TOOL_RESULTS: True})
        if speaker == "assistant":
            self.agent_messages.append(content)
            self.to = "user"
        else:
            if any(token in content for token in USER_STOP_TOKENS):
                return self._end("user_stop")
            self.to = "agent"
        if self.steps >= self.max_steps:
            return self._end("max_steps")
        return content, 0.0, False, False, self._info()

    def solution(self):
        """The gold actions as agent tool calls, one `<tool_call>` block per action."""
        return "\n".join(
            "<tool_call>" + json.dumps({"name": a["name"], "arguments": a.get("arguments", {})})
            + "</tool_call>"
            for a in (self.task.get("evaluation_criteria") or {}).get("actions") or []
            if a.get("requestor", "assistant") == "assistant")

    def close(self):
        self.environment = None

    # -- scoring ------------------------------------------------------------------------------

    def score(self):
        """(reward, breakdown) of the conversation so far, τ²'s way (module docstring)."""
        criteria = self.task.get("evaluation_criteria")
        if not criteria:
            return 1.0, {"note": "no evaluation criteria"}
        basis = set(criteria.get("reward_basis") or ())
        actions = criteria.get("actions") or []
        breakdown = {}
        if basis & {"DB", "ENV_ASSERTION"}:
            gold = self._fresh_environment()
            for action in actions:  # as τ²'s replay: no tool sync between gold actions
                try:
                    gold.make_tool_call(action["name"],
                                        requestor=action.get("requestor", "assistant"),
                                        **action.get("arguments", {}))
                except Exception:  # τ² logs a failing gold action and goes on
                    pass
            db_match = (gold.get_db_hash() == self.environment.get_db_hash()
                        and gold.get_user_db_hash() == self.environment.get_user_db_hash())
            if "DB" in basis:
                breakdown["DB"] = 1.0 if db_match else 0.0
            if "ENV_ASSERTION" in basis:
                breakdown["ENV_ASSERTION"] = float(all(
                    self._assertion_holds(a) for a in criteria.get("env_assertions") or []))
        if "ACTION" in basis:
            breakdown["ACTION"] = float(all(
                any(action_matches(action, name, arguments) for _, name, arguments in self.calls)
                for action in actions))
        if "COMMUNICATE" in basis:
            breakdown["COMMUNICATE"] = float(all(
                communicated(info, self.agent_messages)
                for info in criteria.get("communicate_info") or []))
        reward = 1.0
        for value in breakdown.values():
            reward *= value
        return reward, breakdown

    def needs_judge(self):
        """Whether the reward needs the judge: NL_ASSERTION in the basis, with assertions."""
        criteria = self.task.get("evaluation_criteria") or {}
        return ("NL_ASSERTION" in (criteria.get("reward_basis") or ())
                and bool(criteria.get("nl_assertions")))

    def judge_prompt(self):
        """τ²'s judge prompt for this conversation and the task's NL assertions."""
        conversation = "\n".join(f"{role}: {content}" for role, content in self.trajectory)
        return JUDGE_USER_PROMPT.format(
            conversation=conversation,
            assertions=self.task["evaluation_criteria"]["nl_assertions"])

    # -- internals ----------------------------------------------------------------------------

    def _fresh_environment(self):
        """The domain's environment in the task's initial state (τ²'s `set_state` without a
        message history): the initialization data, then the initialization actions."""
        environment = self.module.get_environment()
        initial = self.task.get("initial_state") or {}
        data = initial.get("initialization_data") or {}
        if data.get("agent_data") is not None:
            environment.tools.update_db(copy.deepcopy(data["agent_data"]))
            if environment.user_tools is not None and environment.user_tools.db is not None:
                environment.user_tools.db = environment.tools.db
        if data.get("user_data") is not None:
            environment.user_tools.update_db(copy.deepcopy(data["user_data"]))
            if environment.tools is not None and environment.tools.db is not None:
                environment.tools.db = environment.user_tools.db
        for call in initial.get("initialization_actions") or []:
            self._run_function(environment, call)
        environment.sync_tools()
        return environment

    def _user_tools(self):
        if self.environment.user_tools is None:
            return []
        return self.environment.get_user_tools(include=self.task.get("user_tools"))

    def _read(self, relative):
        with open(os.path.join(self.tau2_root, relative)) as handle:
            return handle.read()

    @staticmethod
    def _run_function(environment, call):
        toolkit = environment.user_tools if call["env_type"] == "user" else environment.tools
        result = getattr(toolkit, call["func_name"])(**call.get("arguments", {}))
        environment.sync_tools()
        return result

    def _assertion_holds(self, assertion):
        try:
            result = self._run_function(self.environment, assertion)
        except Exception:
            return False
        return isinstance(result, bool) and result == assertion.get("assert_value", True)

    def _call(self, requestor, name, arguments):
        """Run one tool call as τ²'s `Environment.get_response`: the result as JSON text, or
        "Error: ..." (counted towards `max_errors`)."""
        self.calls.append((requestor, name, arguments))
        try:
            result = self.environment.make_tool_call(name, requestor=requestor, **arguments)
            self.environment.sync_tools()
        except Exception as error:
            self.errors += 1
            return f"Error: {error}"
        return self.environment.to_json_str(result)

    def _end(self, reason):
        self.finished = True
        if reason != "user_stop":
            return "", 0.0, False, True, self._info(termination=reason, reward_breakdown={})
        reward, breakdown = self.score()
        if self.needs_judge():
            self.finished, self.to, self.pending_score = False, "judge", (reward, breakdown)
            return self.judge_prompt(), 0.0, False, False, self._info(
                judge_system_prompt=JUDGE_SYSTEM_PROMPT)
        return "", reward, True, False, self._info(termination=reason,
                                                   reward_breakdown=breakdown)

    def _judged(self, verdict):
        """The reward once the judge has given `verdict` on the NL assertions."""
        reward, breakdown = self.pending_score
        breakdown["NL_ASSERTION"] = 1.0 if judged_met(verdict) else 0.0
        self.finished = True
        return "", reward * breakdown["NL_ASSERTION"], True, False, self._info(
            termination="user_stop", reward_breakdown=breakdown)

    def _info(self, **extra):
        return {"to": self.to, "task_id": self.task["id"], "steps": self.steps, **extra}


def _schema(tool):
    schema = tool.openai_schema
    return schema() if callable(schema) else schema


def _tool_response(name, content):
    return "<tool_response>" + json.dumps({"name": name, "content": content}) + "</tool_response>"
