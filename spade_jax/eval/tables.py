"""The paper's result tables: each suite's reference sampling settings, columns and rendering.

    settings = table_settings("rq1", overrides="aime.samples=4,rg_hard.samples=2")
    tasks = table_tasks("rq1", settings, data_dir="data/")    # suite -> [EvalTask]
    ... runner.evaluate(rt, tasks[suite], out / suite, decoding=settings[suite].decoding)
    table = write_table(out, "rq1", settings)                  # table.json and table.md

Every suite's settings live in `SUITE_SETTINGS`, read from the reference's
`eval_offline/configs/games.yaml` (and the files it points at). A column is the fraction of a
suite's episodes (all samples of all items) that scored full marks, over the episodes a
column selects: this is the reference's mean over samples for AIME and GPQA (avg@n), pass@1
for LiveCodeBench, its episode-weighted win rate per bucket for reasoning-gym, and pass@1 per
domain for τ²-bench (successful simulations over tasks × trials). BFCL-v4 is its own overall
score over the categories' accuracies (`bfcl.v4_overall_accuracy`); ACEBench's columns are its
group and summary scores (`acebench.group_accuracy`, `overall_accuracy`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from spade_jax.eval import acebench, bfcl, report, rq1, tau2
from spade_jax.spade.rollout import OBSERVATION_BUDGET, Decoding

log = logging.getLogger(__name__)

TABLE_JSON = "table.json"
TABLE_MD = "table.md"


@dataclasses.dataclass(frozen=True)
class SuiteSettings:
    """How one suite samples: per item `samples` episodes of up to `max_turns` turns, each
    agent turn decoded with `decoding`."""

    samples: int
    decoding: Decoding
    max_turns: int = 1
    unavailable: str = ""  # why the suite cannot run yet ("": it can)
    # SandboxConfig fields this suite's environments need beyond the evaluation's defaults
    sandbox: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # how the simulated user of a conversation suite samples (runner.SIMULATED_USER_SUITES)
    user_decoding: Decoding | None = None
    # tokens of an observation the agent sees before it is cut (tool results, say)
    observation_tokens: int = OBSERVATION_BUDGET


SUITE_SETTINGS: dict[str, SuiteSettings] = {
    # games.yaml suites.aime: n_samples_per_prompt 64, temperature 1.0, top_p 0.95, top_k 20,
    # max_tokens 32768, years [2025, 2026].
    "aime": SuiteSettings(samples=64, decoding=Decoding(temperature=1.0, top_p=0.95, top_k=20,
                                                        max_new_tokens=32768)),
    # games.yaml suites.gpqa_diamond: n_samples_per_prompt 8, temperature 0.7, top_p 0.95,
    # max_tokens 32768 (no top_k).
    "gpqa_diamond": SuiteSettings(samples=8, decoding=Decoding(
        temperature=0.7, top_p=0.95, top_k=0, max_new_tokens=32768)),
    # games.yaml suites.livecodebench: n_samples_per_prompt 1, temperature 0.2, top_p 0.95,
    # max_tokens 16384, release_version release_v6.
    # Its environments carry every test of a problem (some hold megabytes of input) and run
    # them all in one step at up to 6 s each, so code size, memory and time limits are raised.
    "livecodebench": SuiteSettings(samples=1, decoding=Decoding(
        temperature=0.2, top_p=0.95, top_k=0, max_new_tokens=16384),
        sandbox={"max_code_bytes": 1 << 30, "memory_bytes": 4 << 30, "cpu_seconds": 900,
                 "step_timeout_s": 900.0, "play_timeout_s": 900.0}),
    # _games_gem.yaml gem_eval: episodes 8, max_turns 2, temperature 0.6, max_tokens 8192 per
    # task; top_p 0.8 and top_k 20 are fixed in the reference's gem_evaluator (Qwen3 card).
    "rg_hard": SuiteSettings(samples=8, max_turns=2, decoding=Decoding(
        temperature=0.6, top_p=0.8, top_k=20, max_new_tokens=8192)),
    # tool_use.yaml suites.bfcl_full: categories non_live, live, multi_turn; temperature 0.
    # The token budget per turn is ours (the agent's 8192 of the tool-use recipes).
    "bfcl_v4": SuiteSettings(samples=1, decoding=Decoding(
        temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=8192)),
    # _tool_use_tau2.yaml: 4 trials, agent temperature 0.0, top_p 0.8, top_k 20, 16384 tokens,
    # 200 steps (messages of all parties), split base; the user simulator is gpt-4.1 at
    # temperature 0 with 2048 tokens there, the policy itself here. Environments load the
    # domain's database (retail's is 3 MB of JSON) and replay the gold actions to score.
    "tau2": SuiteSettings(samples=4, max_turns=200, decoding=Decoding(
        temperature=0.0, top_p=0.8, top_k=20, max_new_tokens=16384),
        user_decoding=Decoding(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=2048),
        observation_tokens=4096,  # a retail product's details alone run to 3.4 kB of JSON
        sandbox={"memory_bytes": 4 << 30, "cpu_seconds": 1800, "play_timeout_s": 1800.0,
                 "step_timeout_s": 60.0}),
    # tool_use.yaml suites.acebench: test_all (English), temperature 0.7, top_p 1.0, 16384
    # tokens, 40 dialog turns (max_turns: messages of an Agent dialogue). The user simulator is
    # gpt-4o there (ACEBench's APIUSER: temperature 0.001, 1000 tokens), the policy itself here.
    "acebench": SuiteSettings(samples=1, max_turns=40, decoding=Decoding(
        temperature=0.7, top_p=1.0, top_k=0, max_new_tokens=16384),
        user_decoding=Decoding(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=1000)),
}
AIME_YEARS = (2025, 2026)
_SUITE_FIELDS = {"samples": "int", "max_turns": "int"}
_DECODING_FIELDS = {f.name: f.type for f in dataclasses.fields(Decoding)}
USER_PREFIX = "user_"  # `user_max_new_tokens`: the simulated user's decoding, not the agent's
# Fields `table_settings` overrides by name: the suite's own, its decoding's and its user's.
OVERRIDABLE = {**_SUITE_FIELDS, **_DECODING_FIELDS,
               **{USER_PREFIX + name: kind for name, kind in _DECODING_FIELDS.items()}}


@dataclasses.dataclass(frozen=True)
class Column:
    """One table cell: the episodes of `suite` that `select(record)` keeps, scored by `score`
    (records -> value or None; default: the fraction solved)."""

    name: str
    suite: str
    select: Callable[[dict], bool] = lambda record: True
    score: Callable[[list[dict]], float | None] | None = None


@dataclasses.dataclass(frozen=True)
class Table:
    """A paper table: the suites it runs, its columns and its averages (name -> columns)."""

    suites: tuple[str, ...]
    columns: tuple[Column, ...]
    averages: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


def _rg_bucket_column(name: str, bucket: str) -> Column:
    return Column(name, "rg_hard", lambda record: rq1.rg_bucket(record["category"]) == bucket)


def _aime_column(year: int) -> Column:
    return Column(f"AIME {year}", "aime", lambda record: record["category"] == str(year))


def bfcl_v4_score(records: Sequence[dict]) -> float | None:
    """BFCL v4 overall accuracy of the records (None unless every category was played)."""
    by_category: dict[str, list[bool]] = {}
    for record in records:
        by_category.setdefault(record["category"], []).append(record["return"] >= 1.0)
    scores = {c: (sum(solved) / len(solved), len(solved)) for c, solved in by_category.items()}
    required = {c for group in bfcl.v4_categories().values() for c in group}
    return bfcl.v4_overall_accuracy(scores) if required <= set(scores) else None


RG_COLUMNS = ("RG:Math", "RG:Algorithmic", "RG:Cognition", "RG:Logic")
TABLES: dict[str, Table] = {
    # The reference's render_table RQ1 columns (table_mapping.RQ1_COLUMNS), plus the RG average.
    "rq1": Table(
        suites=("aime", "gpqa_diamond", "livecodebench", "rg_hard"),
        columns=(*(_aime_column(year) for year in AIME_YEARS),
                 Column("GPQA-Diamond", "gpqa_diamond"),
                 Column("LiveCodeBench v6", "livecodebench"),
                 *(_rg_bucket_column(name, name[3:].lower()) for name in RG_COLUMNS)),
        averages={"RG:Average": RG_COLUMNS}),
    # The reference's render_table RQ2 columns (table_mapping.RQ2_COLUMNS).
    "rq2": Table(
        suites=("bfcl_v4", "tau2", "acebench"),
        columns=(Column("BFCL-v4", "bfcl_v4", score=bfcl_v4_score),
                 *(Column(f"Tau2-{domain.capitalize()}", "tau2",
                          lambda record, d=domain: record["category"] == d)
                   for domain in ("retail", "airline", "telecom")),
                 *(Column(f"ACEBench-{group[0].upper()}", "acebench",
                          score=lambda records, g=group: acebench.group_accuracy(records, g))
                   for group in acebench.CATEGORIES),
                 Column("ACEBench", "acebench", score=acebench.overall_accuracy))),
}


def table_settings(table: str, overrides: str | Mapping[str, str] = "") -> dict[str, SuiteSettings]:
    """Settings of each suite of `table`, with `overrides` ("suite.field=value,...") applied."""
    suites = _table(table).suites
    settings = {suite: SUITE_SETTINGS[suite] for suite in suites}
    if isinstance(overrides, str):
        pairs = [item.split("=", 1) for item in overrides.split(",") if item.strip()]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError(f"overrides must read suite.field=value,..., got {overrides!r}")
        overrides = {key.strip(): value.strip() for key, value in pairs}
    for key, value in overrides.items():
        suite, _, field = key.partition(".")
        if suite not in settings or field not in OVERRIDABLE:
            raise ValueError(f"unknown setting {key!r}; suites {list(settings)}, fields "
                             f"{list(OVERRIDABLE)}")
        cast = float if OVERRIDABLE[field] == "float" else int
        try:
            typed = cast(value)
        except ValueError as error:
            raise ValueError(f"setting {key}={value!r}: expected {OVERRIDABLE[field]}") from error
        current = settings[suite]
        if field in _SUITE_FIELDS:
            settings[suite] = dataclasses.replace(current, **{field: typed})
        elif field in _DECODING_FIELDS:
            settings[suite] = dataclasses.replace(
                current, decoding=dataclasses.replace(current.decoding, **{field: typed}))
        elif current.user_decoding is None:
            raise ValueError(f"setting {key}: {suite} has no simulated user")
        else:
            user = dataclasses.replace(current.user_decoding,
                                       **{field.removeprefix(USER_PREFIX): typed})
            settings[suite] = dataclasses.replace(current, user_decoding=user)
    return settings


def select_suites(settings: Mapping[str, SuiteSettings], names: str) -> dict[str, SuiteSettings]:
    """`settings` with the suites not named in `names` ("suite,...", "": all) marked
    unavailable, so a table runs on the benchmarks whose data the machine has; ValueError
    naming an unknown suite."""
    chosen = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in settings]
    if unknown:
        raise ValueError(f"unknown suites {unknown}; this table has {list(settings)}")
    if not chosen:
        return dict(settings)
    return {suite: s if suite in chosen else dataclasses.replace(s, unavailable="not selected")
            for suite, s in settings.items()}


def runnable_suites(table: str, settings: Mapping[str, SuiteSettings]) -> list[str]:
    """Suites of `table` that can run; ValueError naming the reasons if none can."""
    runnable = [suite for suite in _table(table).suites if not settings[suite].unavailable]
    if not runnable:
        reasons = "; ".join(settings[suite].unavailable for suite in _table(table).suites)
        raise ValueError(f"table {table} cannot run yet: {reasons}")
    return runnable


def table_tasks(table: str, settings: Mapping[str, SuiteSettings], *,
                data_dir: str | Path | None, limit: int | None = None) -> dict:
    """Tasks per runnable suite of `table`; with `limit`, the first `limit` items per suite.

    Missing data files raise `MissingFileError` naming the path, before any model is loaded.
    """
    tasks = {}
    for suite in runnable_suites(table, settings):
        s = settings[suite]
        if suite == "aime":
            built = [t for year in AIME_YEARS for t in rq1.aime_tasks(data_dir, year, s.samples)]
        elif suite == "gpqa_diamond":
            built = rq1.gpqa_tasks(data_dir, s.samples)
        elif suite == "livecodebench":
            built = rq1.lcb_tasks(data_dir, s.samples)
        elif suite == "bfcl_v4":
            built = bfcl.v4_tasks(limit=limit)
        elif suite == "acebench":
            built = acebench.acebench_tasks(data_dir, s.samples, s.max_turns)
        elif suite == "tau2":
            built = tau2.tau2_tasks(data_dir, s.samples, max_steps=s.max_turns,
                                    max_turns=s.max_turns)
        else:
            built = rq1.rg_hard_tasks(s.samples, s.max_turns)
        tasks[suite] = _first_items(built, limit, by_bucket=suite == "rg_hard")
    return tasks


def _first_items(tasks: list, limit: int | None, by_bucket: bool) -> list:
    """All samples of the first `limit` items, taken round-robin over categories (or buckets)."""
    from spade_jax.eval.runner import fixed_subset

    firsts = [t for t in tasks if t.seed == 0]
    if by_bucket:
        firsts = [dataclasses.replace(t, category=rq1.rg_bucket(t.category)) for t in firsts]
    kept = {t.task_id for t in fixed_subset(firsts, limit)}
    return [t for t in tasks if t.task_id in kept]


def table_values(table: str, records: Sequence[dict]) -> dict[str, dict]:
    """Per column and average: value (solved fraction or None), episodes, items."""
    spec = _table(table)
    values = {}
    for column in spec.columns:
        chosen = [r for r in records if r["suite"] == column.suite and column.select(r)]
        if column.score is not None:
            value = column.score(chosen)
        else:
            value = sum(r["return"] >= 1.0 for r in chosen) / len(chosen) if chosen else None
        values[column.name] = {"value": value,
                               "episodes": len(chosen),
                               "items": len({r["task_id"] for r in chosen})}
    for name, members in spec.averages.items():
        member_values = [values[m]["value"] for m in members]
        mean = (None if None in member_values else sum(member_values) / len(member_values))
        values[name] = {"value": mean, "episodes": sum(values[m]["episodes"] for m in members),
                        "items": sum(values[m]["items"] for m in members)}
    return values


def run_table(rt, table: str, tasks: Mapping[str, Sequence], settings: Mapping[str, SuiteSettings],
              out_dir: str | Path, *, data_dir: str | Path | None = None, batch_size: int = 16,
              seed: int = 0, user_model=None) -> dict:
    """Play each suite's tasks with its settings into `out_dir/<suite>` (resumable); the table.

    `tasks` is `table_tasks(...)` of the same `data_dir`; `rt` a `spade.runtime.Runtime` (see
    `runner.evaluate`); `user_model` plays simulated users (`simulated_user.UserModel`; None:
    the policy).
    """
    from spade_jax.eval import runner

    for suite, suite_tasks in tasks.items():
        log.info("%s: %d episodes, %s", suite, len(suite_tasks), settings[suite])
        sandbox = dict(settings[suite].sandbox)
        if suite == "tau2":
            sandbox["read_only_paths"] = tau2.sandbox_paths(data_dir)
        runner.evaluate(rt, suite_tasks, Path(out_dir) / suite, batch_size=batch_size,
                        decoding=settings[suite].decoding, sandbox=sandbox,
                        user_decoding=settings[suite].user_decoding, user_model=user_model,
                        observation_tokens=settings[suite].observation_tokens,
                        with_hints=False, seed=seed)
    return write_table(out_dir, table, settings)


def write_table(out_dir: str | Path, table: str, settings: Mapping[str, SuiteSettings],
                method: str | None = None) -> dict:
    """Read each suite's `out_dir/<suite>/items.jsonl`; write table.json and table.md."""
    out = Path(out_dir)
    records = []
    for suite in _table(table).suites:
        items = out / suite / report.ITEMS_FILE
        if items.is_file():
            records += report.read_jsonl(items)
    result = {
        "table": table,
        "method": method or out.resolve().name,
        "values": table_values(table, records),
        "settings": {suite: dataclasses.asdict(s) for suite, s in settings.items()},
    }
    (out / TABLE_JSON).write_text(json.dumps(result, indent=2) + "\n")
    (out / TABLE_MD).write_text(markdown(result))
    return result


def markdown(result: dict) -> str:
    """The table as one markdown row per method (percent, one decimal; "—" when not run)."""
    names = list(result["values"])
    lines = [report.md_line(["Method", *names]), report.md_line(["---"] * (len(names) + 1)),
             report.md_line([result["method"],
                              *(_percent(result["values"][n]["value"]) for n in names)])]
    missing = [f"{s}: {v['unavailable']}" for s, v in result["settings"].items()
               if v["unavailable"]]
    notes = "".join(f"\n— {line}" for line in missing)
    return "\n".join(lines) + "\n" + (notes[1:] + "\n" if notes else "")


def compare(dir_a: str | Path, dir_b: str | Path) -> str:
    """Markdown with each column of two table runs side by side and B - A (percent points)."""
    a, b = (load_table(d) for d in (dir_a, dir_b))
    if a["table"] != b["table"]:
        raise ValueError(f"{dir_a} holds table {a['table']}, {dir_b} table {b['table']}")
    lines = [report.md_line(["column", a["method"], b["method"], "delta"]),
             report.md_line(["---"] * 4)]
    for name in dict.fromkeys([*a["values"], *b["values"]]):
        va = a["values"].get(name, {}).get("value")
        vb = b["values"].get(name, {}).get("value")
        delta = None if va is None or vb is None else vb - va
        lines.append(report.md_line([name, _percent(va), _percent(vb),
                                      _percent(delta, signed=True)]))
    return "\n".join(lines) + "\n"


def load_table(out_dir: str | Path) -> dict:
    """The table.json of a table run; MissingFileError naming it if absent."""
    from spade_jax.errors import MissingFileError

    path = Path(out_dir) / TABLE_JSON
    if not path.is_file():
        raise MissingFileError(f"{out_dir} holds no {TABLE_JSON}")
    return json.loads(path.read_text())


def is_table_dir(out_dir: str | Path) -> bool:
    """Whether `out_dir` holds a table run (table.json) rather than a suite run."""
    return (Path(out_dir) / TABLE_JSON).is_file()


def _table(name: str) -> Table:
    if name not in TABLES:
        raise ValueError(f"unknown table {name!r}; choose from {list(TABLES)}")
    return TABLES[name]


def _percent(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "—"
    return f"{value * 100:+.1f}" if signed else f"{value * 100:.1f}"
