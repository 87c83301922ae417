"""Play evaluation tasks with the training rollout and write their results (docs/DESIGN.md §7).

    tasks = build_tasks(["games", "reasoning_gym"], limit=5, games_max_turns=4)
    summary = evaluate(rt, tasks, "runs/eval1", decoding=greedy(max_new_tokens=256))

Every task is an episode of `spade.rollout.play_episodes` on the runtime's sampler with the
caller's `Decoding` (`greedy(...)` for greedy decoding), in batches that share an agent prompt
(each episode keeps its task's turn limit). A task whose environment defines `hint()` is also
played with that hint (`envrunner.ENV_HINT`, leak-checked as in training).
Rows go to `items.jsonl` after every batch, so a rerun into the same directory skips what is
already scored; `summary.json` and `summary.md` are written at the end (`report`).
"""

from __future__ import annotations

import ast
import dataclasses
import itertools
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from etils import epath
from tqdm import tqdm

from spade_jax.envs.lint import parse_source
from spade_jax.eval import report
from spade_jax.eval.games import named_game_tasks
from spade_jax.eval.simulated_user import UserModel, UserSimulatorRunner
from spade_jax.eval.suites import build_eval_tasks
from spade_jax.eval.tasks import EvalTask
from spade_jax.spade import prompts
from spade_jax.spade.envrunner import ENV_HINT, SandboxEnvRunner
from spade_jax.spade.rollout import (
    OBSERVATION_BUDGET,
    Decoding,
    Episode,
    EpisodeSpec,
    conversation_capacity,
    play_episodes,
)

log = logging.getLogger(__name__)

# Command-line / config suite names -> `suites.build_eval_tasks` names.
SUITE_NAMES = {
    "bfcl_multi_turn": "bfcl",
    "humaneval": "humaneval",
    "reasoning_gym": "reasoning_gym",
    "games": "games",
}
TOOL_USE_SUITES = ("bfcl", "bfcl_v4")  # played with the tool-use agent prompt; the rest as games
# Played with the benchmark's user message alone, as the reference's eval_offline suites do.
NO_SYSTEM_PROMPT_SUITES = ("aime", "gpqa_diamond", "livecodebench", "rg_hard")
# Conversations with a simulated user (`simulated_user.UserSimulatorRunner`); their environments
# give each episode's agent system prompt (τ²: in the reset info; ACEBench: in its first
# observation, as the reference's eval_offline suites play it).
SIMULATED_USER_SUITES = ("tau2", "acebench")
SEED_GAMES = "seeds"  # the games suite from our (non-tool-use) seed environments
EVAL_STEP_TIMEOUT_S = 10.0  # above the benchmarks' own limits (HumanEval runs tests for 3 s)
REPLY_CHARS = 2000  # characters kept per agent reply in items.jsonl


def parse_suites(names: str | Iterable[str]) -> list[str]:
    """Suite names (a comma string or a list) as `build_eval_tasks` names; ValueError if unknown."""
    if isinstance(names, str):
        names = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in names if name not in SUITE_NAMES]
    if unknown or not names:
        raise ValueError(f"unknown eval suites {unknown or names}; choose from {list(SUITE_NAMES)}")
    return [SUITE_NAMES[name] for name in names]


def build_tasks(
    suite_names: str | Iterable[str],
    *,
    limit: int | None = None,
    games: str = SEED_GAMES,
    games_max_turns: int = 25,
    games_seeds: int = 8,
    bfcl_step_limit: int | None = None,
) -> list[EvalTask]:
    """Tasks of the named suites; with `limit`, a fixed subset of `limit` items per suite.

    `games` is 'seeds' (our seed game environments) or a directory of environment files.
    """
    suites = parse_suites(suite_names)
    from_dir = games != SEED_GAMES
    built = build_eval_tasks(
        [s for s in suites if s != "games" or from_dir],
        bfcl_limit=limit,
        bfcl_step_limit=bfcl_step_limit,
        humaneval_limit=limit,
        games_dir=games if from_dir else None,
        games_seeds=games_seeds,
        games_max_turns=games_max_turns,
    )
    if "games" in suites and not from_dir:
        from spade_jax.envs.seeds import list_seed_envs

        seeds = [(e.name, e.code, str(e.path)) for e in list_seed_envs(tool_use=False)]
        built["games"] = named_game_tasks(seeds, games_seeds, games_max_turns)
    return [task for suite in suites for task in fixed_subset(built[suite], limit)]


def fixed_subset(tasks: Sequence[EvalTask], limit: int | None) -> list[EvalTask]:
    """The first `limit` tasks taken round-robin over categories (deterministic; None: all)."""
    if limit is None:
        return list(tasks)
    by_category: dict[str, list[EvalTask]] = {}
    for task in tasks:
        by_category.setdefault(task.category, []).append(task)
    interleaved = itertools.chain.from_iterable(itertools.zip_longest(*by_category.values()))
    return [task for task in interleaved if task is not None][:limit]


def defines_hint(code: str) -> bool:
    """Whether the environment's `*Env` class defines its own `hint()` method."""
    for node in parse_source(code).body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("Env"):
            return any(isinstance(item, ast.FunctionDef) and item.name == "hint"
                       for item in node.body)
    return False


def greedy(max_new_tokens: int) -> Decoding:
    """Greedy decoding (temperature 0, no top-p / top-k cut) of up to `max_new_tokens` a turn."""
    return Decoding(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens)


def evaluate(
    rt,
    tasks: Sequence[EvalTask],
    out_dir: str | Path | None,
    *,
    decoding: Decoding,
    sandbox: Mapping[str, Any] | None = None,
    user_decoding: Decoding | None = None,
    user_model: UserModel | None = None,
    observation_tokens: int = OBSERVATION_BUDGET,
    batch_size: int = 16,
    with_hints: bool = True,
    resume: bool = True,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Play every task (and its hinted variant), write results under `out_dir`; the summary.

    `rt` needs `sampler`, `chat` and `run` (a `spade.runtime.Runtime`); the environments run
    in a sandbox pool of this evaluation, `EVAL_STEP_TIMEOUT_S` per call unless `sandbox`
    (SandboxConfig fields) says otherwise. With
    `resume`, episodes already in `out_dir/items.jsonl` are skipped; without, `out_dir` starts
    empty. The summary covers this call's episodes only. `out_dir=None` writes nothing (other
    hosts of a run). Every agent turn samples with `decoding`; the simulated user of
    `SIMULATED_USER_SUITES` with `user_decoding`, by `user_model` (None: the policy). An
    observation longer than about `observation_tokens` is cut.
    """
    if user_decoding is None and any(t.suite in SIMULATED_USER_SUITES for t in tasks):
        raise ValueError(f"suites {SIMULATED_USER_SUITES} need user_decoding for their "
                         "simulated user")
    out = epath.Path(out_dir) if out_dir is not None else None
    if out is not None and not resume and out.exists():
        out.rmtree()
    items = out / report.ITEMS_FILE if out is not None else None
    episodes = [(task, hint) for task in tasks
                for hint in ((False, True) if with_hints and defines_hint(task.code) else (False,))]
    wanted = {_task_key(task, hint) for task, hint in episodes}
    scored = report.resume_jsonl(items) if items is not None and items.exists() else []
    records = [r for r in scored if _record_key(r) in wanted]
    done = {_record_key(r) for r in records}
    pending = [(task, hint) for task, hint in episodes if _task_key(task, hint) not in done]
    if records:
        log.info("%s: %d rows already scored, %d episodes to play", out, len(records),
                 len(pending))
    pool = _eval_pool(rt.run.sandbox, sandbox or {})
    bar = tqdm(total=len(episodes), initial=len(episodes) - len(pending), desc="eval",
               unit="episode", disable=not progress)
    try:
        for batch in _batches(pending, batch_size):
            played = _play(rt, pool, batch, decoding, user_decoding,
                           user_model or UserModel(rt.sampler, rt.chat), observation_tokens,
                           seed=seed)
            rows = [_episode_row(task, hint, episode, rt.chat.tokenizer)
                    for (task, hint), episode in zip(batch, played, strict=True)]
            if items is not None:
                report.append_jsonl(items, rows)
            records += rows
            bar.update(len(batch))
    finally:
        bar.close()
        pool.shutdown()
    if out is None:
        return report.summarize(records)
    out.mkdir(parents=True, exist_ok=True)
    return report.write_summary(out, records)


def summary_metrics(summary: dict) -> dict[str, float]:
    """Mean returns as `eval/<suite>/<category>` and `eval/<suite>/mean` (hinted: `.../hint`)."""
    metrics = {}
    for row in summary["rows"]:
        category = "mean" if row["category"] == report.SUITE_MEAN else row["category"]
        suffix = "/hint" if row["hint"] else ""
        metrics[f"eval/{row['suite']}/{category}{suffix}"] = row["mean_return"]
    return metrics


def in_loop_tasks(eval_config, games_max_turns: int) -> list[EvalTask]:
    """The fixed subset an `EvalConfig` names for in-loop evaluation (none when every is 0)."""
    if eval_config.every <= 0:
        return []
    return build_tasks(eval_config.suites, limit=eval_config.limit or None,
                       games=eval_config.games, games_max_turns=games_max_turns)


def run_in_loop_eval(rt, tasks: Sequence[EvalTask], out_dir: str | Path | None, *,
                     max_new_tokens: int, seed: int) -> dict[str, float]:
    """Evaluate `tasks` afresh (no hints, greedy) into `out_dir`; their `eval/*` metrics."""
    summary = evaluate(rt, tasks, out_dir, decoding=greedy(max_new_tokens),
                       with_hints=False, resume=False, progress=False, seed=seed)
    return summary_metrics(summary)


def restore_checkpoint(rt, path: str | Path) -> int:
    """Load the params of a training checkpoint (a workdir or its `checkpoints/<step>`,
    `checkpoint.checkpoint_location`) into `rt`; its step."""
    from spade_jax.checkpoint import checkpoint_location, restore_state

    state, step = restore_state(*checkpoint_location(path), rt.device_state())
    rt.set_device_state(state)
    return step


def _eval_pool(sandbox, overrides: Mapping[str, float]):
    """A pool with the run's `SandboxConfig`, the evaluation's step timeout and `overrides`."""
    from spade_jax.envs import EnvPool

    config = dataclasses.replace(sandbox, **{"step_timeout_s": EVAL_STEP_TIMEOUT_S, **overrides})
    if config.problems():
        raise ValueError(f"evaluation sandbox settings: {'; '.join(config.problems())}")
    return EnvPool(config, warm=sandbox.warm_workers)


def _batches(pending: list[tuple[EvalTask, bool]], batch_size: int):
    """Batches of at most `batch_size` episodes sharing an agent prompt, in task order; one-turn
    episodes apart from longer ones (a batch's KV cache is sized for its longest)."""
    groups: dict[tuple[str | None, bool, bool], list] = {}
    for task, hint in pending:
        key = (_system_prompt(task), task.max_turns > 1, task.suite in SIMULATED_USER_SUITES)
        groups.setdefault(key, []).append((task, hint))
    for group in groups.values():
        for start in range(0, len(group), batch_size):
            yield group[start:start + batch_size]


def _system_prompt(task: EvalTask) -> str | None:
    """The agent system prompt `task` is played with (None: the user message alone)."""
    if task.suite in NO_SYSTEM_PROMPT_SUITES + SIMULATED_USER_SUITES:
        return None
    tool_use = task.suite in TOOL_USE_SUITES
    game_type = prompts.GameType.TOOL_USE if tool_use else prompts.GameType.GAME
    return game_type.agent_system_prompt


def _play(rt, pool, batch, decoding: Decoding, user_decoding: Decoding | None,
          user_model: UserModel, observation_tokens: int, *, seed: int) -> list[Episode]:
    specs = [EpisodeSpec(t.task_id, t.code, t.seed, ENV_HINT if hint else None, t.max_turns)
             for t, hint in batch]
    turns = max(t.max_turns for t, _ in batch)
    capacity = conversation_capacity(turns, decoding.max_new_tokens,
                                     rt.run.sampling.max_context)
    if batch[0][0].suite in SIMULATED_USER_SUITES:
        envs = UserSimulatorRunner(pool, turns, sampler=user_model.sampler,
                                   chat=user_model.chat,
                                   decoding=user_decoding, seed=seed,
                                   capacity=conversation_capacity(
                                       turns, user_decoding.max_new_tokens,
                                       rt.run.sampling.max_context))
    else:
        envs = SandboxEnvRunner(pool, turns)
    return play_episodes(
        specs, sampler=rt.sampler, envs=envs, chat=rt.chat,
        system_prompt=_system_prompt(batch[0][0]), max_turns=turns,
        decoding=decoding, seed=seed, capacity=capacity, max_observation_tokens=observation_tokens)


def _episode_row(task: EvalTask, hint: bool, episode: Episode, tokenizer) -> dict:
    info = {"status": episode.status, "rewards": episode.rewards,
            "replies": _agent_replies(episode, tokenizer)}
    if hint:
        info["hint_shown"] = episode.hint is not None
    return report.episode_record(task, episode.episode_return, hint=hint,
                                 crashed=episode.failed, n_steps=episode.turns, info=info)


def _agent_replies(episode: Episode, tokenizer) -> list[str]:
    """The text of each agent turn (each run of generated tokens), cut to `REPLY_CHARS`."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], episode.loss_mask.astype(np.int8), [0]])))
    return [tokenizer.decode(episode.tokens[a:b], skip_special_tokens=True)[:REPLY_CHARS]
            for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _task_key(task: EvalTask, hint: bool) -> tuple:
    return (task.suite, task.task_id, task.seed, hint)


def _record_key(record: dict) -> tuple:
    return (record["suite"], record["task_id"], record["seed"], bool(record["hint"]))
