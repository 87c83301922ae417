"""Evaluate a policy on held-out benchmarks, or compare two evaluation runs.

    python launch/eval.py --config=configs/smollm2_135m.py --model=smollm2-135m-instruct \
        --suites=bfcl_multi_turn,humaneval,reasoning_gym,games --limit=5 --out=runs/eval/base
    python launch/eval.py --config=configs/smollm2_135m.py --checkpoint=runs/smollm2 \
        --out=runs/eval/trained                  # a training workdir or its checkpoints/<step>
    python launch/eval.py --compare runs/eval/base runs/eval/trained
    python launch/eval.py --config=configs/4b.py --checkpoint=runs/4b --table=rq1 \
        --data_dir=data/ --out=runs/rq1/trained   # the paper's RQ1 table, reference settings
    python launch/eval.py --config=configs/4b.py --checkpoint=runs/4b --table=rq2 \
        --data_dir=data/ --out=runs/rq2/trained   # RQ2: BFCL-v4, tau2, ACEBench (clones in data/)

Writes `items.jsonl` (one row per episode), `summary.json` and `summary.md` (per suite, per
category and the suite mean; with and without hints where the environment defines one) under
--out, rows after every batch of episodes, with a progress bar. Rerunning into the same --out
(after a kill, say) skips the episodes already scored. --limit keeps a fixed
subset of that many items per suite, spread over its categories. Any config key can be
overridden as in launch/train.py (e.g. --config.sampling.max_context=8192).

--table=rq1|rq2 runs every suite of that paper table with its reference settings
(`spade_jax/eval/tables.py`; change them with e.g. --table_settings=aime.samples=8) into
--out/<suite>/ (resumable as above) and writes --out/table.json and table.md. --compare on two
table outputs prints their columns side by side with the difference.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

from spade_jax.cli import run

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a configs/*.py file.")
_CHECKPOINT = flags.DEFINE_string(
    "checkpoint", None, "Training workdir (newest checkpoint) or its checkpoints/<step> dir.")
_MODEL = flags.DEFINE_string(
    "model", None, "Model to evaluate instead of config.model.source: a name, HF dir or .gguf.")
_SUITES = flags.DEFINE_string(
    "suites", "bfcl_multi_turn,humaneval,reasoning_gym,games", "Comma-separated suites.")
_LIMIT = flags.DEFINE_integer("limit", 0, "Items per suite (a fixed subset); 0: all.")
_OUT = flags.DEFINE_string("out", None, "Result directory (resumed if it holds results).")
_COMPARE = flags.DEFINE_bool(
    "compare", False, "Print two result dirs side by side: --compare DIR1 DIR2.")
_MAX_NEW_TOKENS = flags.DEFINE_integer(
    "max_new_tokens", 0, "Tokens per agent turn; 0: config.sampling.agent_max_new_tokens.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "Sampling temperature (0: greedy).")
_BATCH = flags.DEFINE_integer("batch_size", 16, "Episodes played at once.")
_HINTS = flags.DEFINE_bool("hints", True, "Also play hinted episodes where an env has hint().")
_GAMES = flags.DEFINE_string(
    "games", "seeds", "Games suite: 'seeds' (our seed games) or a directory of env files.")
_GAMES_MAX_TURNS = flags.DEFINE_integer(
    "games_max_turns", 0, "Turn limit of the games suite; 0: config.spade.max_turns.")
_BFCL_STEP_LIMIT = flags.DEFINE_integer(
    "bfcl_step_limit", 0, "Calls per BFCL user turn before force-quit; 0: BFCL's own (20).")
_TABLE = flags.DEFINE_string(
    "table", None, "Run a paper table (rq1, rq2) with its suites' reference settings; --suites, "
    "--temperature, --max_new_tokens and --hints do not apply.")
_DATA_DIR = flags.DEFINE_string(
    "data_dir", None, "Directory of benchmark data files the packages do not ship (README).")
_TABLE_SETTINGS = flags.DEFINE_string(
    "table_settings", "", "Overrides of suite settings: suite.field=value,... "
    "(fields: samples, temperature, top_p, top_k, max_new_tokens, max_turns; user_ before a "
    "decoding field sets the simulated user's, e.g. acebench.user_max_new_tokens=64).")
_TABLE_SUITES = flags.DEFINE_string(
    "table_suites", "", "Only these suites of --table (comma-separated; default: all), e.g. "
    "the ones whose data --data_dir has; the others show '—' with the reason.")
_USER_MODEL = flags.DEFINE_string(
    "user_model", None, "Model playing the simulated users of --table suites (tau2, ACEBench's "
    "Agent dialogues): a name, HF dir or .gguf, as --model; default: the policy evaluated.")
_UNSAFE = flags.DEFINE_bool(
    "allow_unsafe_sandbox", False,
    "Run benchmark code even if only rlimits (no bubblewrap/seccomp) are available.")


def main(argv):
    from spade_jax.eval import report, runner, tables
    from spade_jax.workdir import check_writable

    if _COMPARE.value:
        if len(argv) != 3:
            raise app.UsageError("--compare takes two result directories: --compare DIR1 DIR2")
        if all(tables.is_table_dir(directory) for directory in argv[1:]):
            try:
                print(tables.compare(argv[1], argv[2]), end="")
            except ValueError as err:
                sys.exit(f"error: {err}")
            return
        for directory in argv[1:]:
            if not (Path(directory) / report.SUMMARY_JSON).is_file():
                sys.exit(f"error: {directory} holds no {report.SUMMARY_JSON} or "
                         f"{tables.TABLE_JSON}")
        print(report.compare(argv[1], argv[2]), end="")
        return
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {argv[1:]}")
    if _CONFIG.value is None or _OUT.value is None:
        raise app.UsageError("--config and --out are required (or --compare DIR1 DIR2)")
    if _CHECKPOINT.value and _MODEL.value:
        raise app.UsageError("give --checkpoint or --model, not both")
    cfg = _CONFIG.value
    if _MODEL.value:
        cfg.model.source = _MODEL.value
    if _UNSAFE.value:
        cfg.sandbox.allow_unsafe = True
    from spade_jax.checkpoint import checkpoint_location
    from spade_jax.config import parse

    run_config = parse(cfg)
    try:
        if _TABLE.value:
            settings = tables.select_suites(
                tables.table_settings(_TABLE.value, _TABLE_SETTINGS.value), _TABLE_SUITES.value)
            suite_tasks = tables.table_tasks(_TABLE.value, settings, data_dir=_DATA_DIR.value,
                                             limit=_LIMIT.value or None)
        else:
            tasks = runner.build_tasks(
                _SUITES.value, limit=_LIMIT.value or None, games=_GAMES.value,
                games_max_turns=_GAMES_MAX_TURNS.value or run_config.spade.max_turns,
                bfcl_step_limit=_BFCL_STEP_LIMIT.value or None)
        if _CHECKPOINT.value:
            checkpoint_location(_CHECKPOINT.value)
        check_writable(_OUT.value)
    except (ValueError, ImportError, OSError) as err:  # OSError: a missing file, --out unwritable
        sys.exit(f"error: {err}")

    from spade_jax.spade.runtime import Runtime

    rt = Runtime.create(run_config)
    try:
        if _CHECKPOINT.value:
            step = runner.restore_checkpoint(rt, _CHECKPOINT.value)
            logging.info("evaluating checkpoint %d of %s", step, _CHECKPOINT.value)
        if _TABLE.value:
            from spade_jax.eval.simulated_user import load_user_model

            user_model = load_user_model(rt, _USER_MODEL.value) if _USER_MODEL.value else None
            tables.run_table(rt, _TABLE.value, suite_tasks, settings, _OUT.value,
                             data_dir=_DATA_DIR.value, batch_size=_BATCH.value,
                             seed=run_config.seed, user_model=user_model)
        else:
            decoding = dataclasses.replace(
                runner.greedy(_MAX_NEW_TOKENS.value or run_config.sampling.agent_max_new_tokens),
                temperature=_TEMPERATURE.value)
            runner.evaluate(rt, tasks, _OUT.value, decoding=decoding, batch_size=_BATCH.value,
                            with_hints=_HINTS.value, seed=run_config.seed)
    finally:
        rt.close()
    if _TABLE.value:
        print((Path(_OUT.value) / tables.TABLE_MD).read_text(), end="")
        return
    print((Path(_OUT.value) / report.SUMMARY_MD).read_text(), end="")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    for noisy in ("absl", "orbax", "jax._src"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    run(main)
