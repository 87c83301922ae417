"""ACEBench (English, test_all) as evaluation tasks, and its Normal / Special / Agent roll-up.

The data, prompts and Agent scenario classes come from the user's clone of
https://github.com/ACEBench/ACEBench at `--data_dir/ACEBench` (`ACEBENCH_DIR`): items from
`data_all/data_en/data_<category>.json`, answers from `.../possible_answer/`, prompt texts read
as literals from its `model_inference/*.py` (never executed here), and the scenario modules'
source, which the environment executes in the sandbox. Our repository holds none of ACEBench's
text or code. Every item is `acebench_env.py` bound to it, scored there by ACEBench's rules.

Roll-up, as ACEBench's `model_eval/evaluation_helper.generate_result_csv`: a category's
accuracy is the fraction of items passed (for the two Normal multi-turn categories, of
conversations whose every turn passed: `multiplt_turn_accuracy`); a group's is the unweighted
mean of its categories'; the overall score weighs the groups 0.578 / 0.2676 / 0.1545.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from spade_jax.eval import acebench_env
from spade_jax.eval.rq1 import data_file
from spade_jax.eval.tasks import EvalTask, bound_env_code

ACEBENCH_DIR = "ACEBench"  # under --data_dir: `git clone https://github.com/ACEBench/ACEBench`
DATA_FILE = "data_all/data_en/data_{category}.json"
ANSWER_FILE = "data_all/data_en/possible_answer/data_{category}.json"
# category.py ACE_DATA_CATEGORY, the groups of "test_all".
CATEGORIES = {
    "normal": ("normal_single_turn_single_function", "normal_single_turn_parallel_function",
               "normal_multi_turn_user_adjust", "normal_multi_turn_user_switch",
               "normal_similar_api", "normal_preference", "normal_atom_bool", "normal_atom_enum",
               "normal_atom_number", "normal_atom_list", "normal_atom_object_deep",
               "normal_atom_object_short"),
    "special": ("special_incomplete", "special_error_param", "special_irrelevant"),
    "agent": ("agent_multi_step", "agent_multi_turn"),
}
ALL_CATEGORIES = tuple(c for group in CATEGORIES.values() for c in group)
GROUP_WEIGHTS = {"normal": 0.578, "special": 0.2676, "agent": 0.1545}  # generate_result_csv
# Where the clone keeps the texts the environment needs (module-level string/dict literals).
PROMPT_FILE = "model_inference/prompt_en.py"
SAVED_ATTRIBUTES_FILE = "model_inference/apimodel_inference.py"  # SAVED_CLASS
USER_FILE = "model_inference/multi_turn/APIModel_user.py"
AGENT_FILES = {"agent_multi_turn": "model_inference/multi_turn/APIModel_agent.py",
               "agent_multi_step": "model_inference/multi_step/APIModel_agent.py"}
CLASS_MAP_FILES = {"agent_multi_turn": "model_inference/multi_turn/multi_turn_utils.py",
                   "agent_multi_step": "model_inference/multi_step/multi_step_utils.py"}
USER_PROMPTS = {"BaseApi": "SYSTEM_PROMPT_BASE_EN", "Travel": "SYSTEM_PROMPT_TRAVEL_EN"}
DOMAIN_PROMPTS = {"Travel": "TRAVEL_PROMPT_EN", "BaseApi": "BASE_PROMPT_EN"}  # in this order


def clone_file(data_dir: str | Path | None, relative: str) -> Path:
    """`data_dir/ACEBench/relative`; MissingFileError naming it if absent."""
    return data_file(data_dir, f"{ACEBENCH_DIR}/{relative}", "ACEBench")


def module_literals(path: Path, names: Sequence[str]) -> dict:
    """The module-level literals `names` of a Python file, read without running it."""
    found = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id in names:
            found[node.targets[0].id] = ast.literal_eval(node.value)
    missing = [name for name in names if name not in found]
    if missing:
        raise ValueError(f"{path} defines no literal {missing}: is it an ACEBench clone?")
    return found


def load_category(data_dir: str | Path | None, category: str) -> list[tuple[dict, object]]:
    """(item, ground truth) for every item of an English category, in file order."""
    if category not in ALL_CATEGORIES:
        raise ValueError(f"unknown ACEBench category {category!r}; choose from {ALL_CATEGORIES}")
    items = _json_lines(clone_file(data_dir, DATA_FILE.format(category=category)))
    answer_path = clone_file(data_dir, ANSWER_FILE.format(category=category))
    answers = _json_lines(answer_path)
    if [item["id"] for item in items] != [answer["id"] for answer in answers]:
        raise ValueError(f"{answer_path} does not list the ids of its data file in order")
    return [(item, answer["ground_truth"]) for item, answer in zip(items, answers, strict=True)]


def _json_lines(path: Path) -> list[dict]:
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise ValueError(f"{path} line {number} is not JSON: {error}") from error
    return rows


def single_turn_prompt(item: dict, category: str, prompts: Mapping[str, str]) -> str:
    """ACEBench's system and user prompt of a Normal / Special item, as one message."""
    functions = item["function"]
    if category.startswith("special"):
        system = prompts["SYSTEM_PROMPT_FOR_SPECIAL_DATA_EN"].format(
            time=item.get("time", ""), function=functions)
    elif "preference" in category:
        system = prompts["SYSTEM_PROMPT_FOR_PREFERENCE_DATA_EN"].format(
            profile=item.get("profile", ""), function=functions)
    else:
        system = prompts["SYSTEM_PROMPT_FOR_NORMAL_DATA_EN"].format(
            time=item.get("time", ""), function=functions)
    return system + "\n\n" + prompts["USER_PROMPT_EN"].format(question=item["question"])


def category_tasks(data_dir: str | Path | None, category: str, samples: int = 1,
                   max_dialog_turns: int = 40) -> list[EvalTask]:
    """`samples` tasks (seed = sample index) per item of one category (suite "acebench");
    an Agent dialogue ends after `max_dialog_turns` messages (generate.py's default, 40)."""
    entries = load_category(data_dir, category)
    if category.startswith("agent"):
        binder = _agent_binder(data_dir, category, max_dialog_turns)
        max_turns = max_dialog_turns + 1  # environment steps: its messages and the opening
    else:
        prompts = module_literals(clone_file(data_dir, PROMPT_FILE), (
            "SYSTEM_PROMPT_FOR_NORMAL_DATA_EN", "SYSTEM_PROMPT_FOR_PREFERENCE_DATA_EN",
            "SYSTEM_PROMPT_FOR_SPECIAL_DATA_EN", "USER_PROMPT_EN"))

        def binder(item, truth):
            return dict(prompt=single_turn_prompt(item, category, prompts),
                        functions_json=json.dumps(item["function"]))
        max_turns = 1
    tasks = []
    for item, truth in entries:
        code = bound_env_code(acebench_env, item_id=item["id"], category=category,
                              ground_truth_json=json.dumps(truth), **binder(item, truth))
        tasks += [EvalTask("acebench", category, item["id"], code, seed=sample,
                           max_turns=max_turns) for sample in range(samples)]
    return tasks


def _agent_binder(data_dir, category, max_dialog_turns):
    """A function binding an Agent item: its prompts, scenario sources and saved attributes."""
    agent = module_literals(clone_file(data_dir, AGENT_FILES[category]), (
        "MULTI_TURN_AGENT_PROMPT_SYSTEM_EN", "MULTI_TURN_AGENT_PROMPT_USER_EN"))
    class_modules = module_literals(clone_file(data_dir, CLASS_MAP_FILES[category]),
                                    ("CLASS_FILE_PATH_MAPPING_EN",))["CLASS_FILE_PATH_MAPPING_EN"]
    saved = module_literals(clone_file(data_dir, SAVED_ATTRIBUTES_FILE),
                            ("SAVED_CLASS",))["SAVED_CLASS"]
    sources = scenario_sources(data_dir)
    multi_turn = category == "agent_multi_turn"
    domain = module_literals(clone_file(data_dir, PROMPT_FILE), tuple(DOMAIN_PROMPTS.values()))
    users = module_literals(clone_file(data_dir, USER_FILE), tuple(USER_PROMPTS.values()))

    def binder(item, truth):
        classes = item["involved_classes"]
        unknown = [name for name in classes if name not in class_modules or name not in saved]
        if unknown:
            raise ValueError(f"ACEBench item {item['id']} involves unknown classes {unknown}")
        system = agent["MULTI_TURN_AGENT_PROMPT_SYSTEM_EN"]
        user_prompt = ""
        if multi_turn:  # the multi-turn agent adds each domain's policy; the user its own
            system += "".join(domain[p] for c, p in DOMAIN_PROMPTS.items() if c in classes)
            user_prompt = next((users[p] for c, p in USER_PROMPTS.items() if c in classes), "")
            if not user_prompt:
                raise ValueError(f"ACEBench item {item['id']}: no user prompt for {classes}")
        return dict(question=item["question"], initial_config=item["initial_config"],
                    involved_classes=classes, functions=str(item["function"]),
                    agent_system_prompt=system,
                    agent_user_prompt=agent["MULTI_TURN_AGENT_PROMPT_USER_EN"],
                    user_prompt=user_prompt, max_dialog_turns=max_dialog_turns,
                    scenario_sources=sources, class_modules=class_modules,
                    saved_attributes={name: list(saved[name]) for name in classes})
    return binder


def scenario_sources(data_dir: str | Path | None) -> dict[str, str]:
    """{dotted module name: source} of every module in the clone's scenario packages (those
    holding the classes both Agent categories name: their modules import across them)."""
    modules = [module for path in CLASS_MAP_FILES.values()
               for module in module_literals(clone_file(data_dir, path), (
                   "CLASS_FILE_PATH_MAPPING_EN",))["CLASS_FILE_PATH_MAPPING_EN"].values()]
    for module in modules:
        clone_file(data_dir, module.replace(".", "/") + ".py")
    root = clone_file(data_dir, PROMPT_FILE).parents[1]
    packages = {root.joinpath(*module.split(".")[:3]) for module in modules}
    return {".".join(path.relative_to(root).with_suffix("").parts): path.read_text(
        encoding="utf-8") for package in sorted(packages) for path in sorted(package.rglob("*.py"))}


def acebench_tasks(data_dir: str | Path | None, samples: int = 1, max_dialog_turns: int = 40,
                   categories: Sequence[str] = ALL_CATEGORIES) -> list[EvalTask]:
    """Tasks of every item of `categories` (default: ACEBench's test_all)."""
    return [task for category in categories
            for task in category_tasks(data_dir, category, samples, max_dialog_turns)]


def category_accuracy(category: str, records: Sequence[dict]) -> float:
    """ACEBench's accuracy of a category's episodes: the fraction passed, or for a Normal
    multi-turn category the fraction of (conversation, sample) whose every turn passed."""
    if not records:
        raise ValueError(f"no episodes of ACEBench category {category!r}")
    if not category.startswith("normal_multi_turn"):
        return sum(r["return"] >= 1.0 for r in records) / len(records)
    conversations: dict[tuple, bool] = {}
    for record in records:
        key = (record["task_id"].rsplit("_", 1)[0], record["seed"])
        conversations[key] = conversations.get(key, True) and record["return"] >= 1.0
    return sum(conversations.values()) / len(conversations)


def group_accuracy(records: Sequence[dict], group: str) -> float | None:
    """Unweighted mean of the group's category accuracies (None unless every one was played)."""
    by_category: dict[str, list[dict]] = {}
    for record in records:
        by_category.setdefault(record["category"], []).append(record)
    if not set(CATEGORIES[group]) <= set(by_category):
        return None
    scores = [category_accuracy(c, by_category[c]) for c in CATEGORIES[group]]
    return sum(scores) / len(scores)


def overall_accuracy(records: Sequence[dict]) -> float | None:
    """ACEBench's summary score: the groups weighted 0.578 / 0.2676 / 0.1545 (None unless
    every category was played)."""
    groups = {group: group_accuracy(records, group) for group in CATEGORIES}
    if None in groups.values():
        return None
    return sum(GROUP_WEIGHTS[g] * value for g, value in groups.items())
