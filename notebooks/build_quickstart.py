"""Build `notebooks/colab_quickstart.ipynb` from the cells below (the reviewable source).

    python notebooks/build_quickstart.py

Edit the cells here, rebuild, and commit both files; tests/scaleout/test_notebook.py checks
that the notebook matches this script and runs it top to bottom on the tiny config.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

NOTEBOOK = Path(__file__).with_name("colab_quickstart.ipynb")

CELLS: list[tuple[str, str]] = [
    ("md", """\
# SPADE quickstart: a Designer writes environments, an Agent learns to play them

This notebook runs the whole SPADE loop of `spade_jax` end to end:

1. load a small policy (one model plays both roles: Environment Designer and Reasoning Agent);
2. ask the Designer for one environment and pass it through the validation gate;
3. let the Agent play it without and with a hint (the gap is the environment's *regret*);
4. run two SPADE cycles (design, validate, play, reward, train);
5. plot regret and returns, and evaluate on held-out games.

On a CPU it runs with `MODEL = "tiny"` (a random 2-layer model: it writes nothing valid, but
every stage runs) in a few minutes. On Colab with a TPU or GPU runtime change the one line
`MODEL = ...` below to `"smollm2_135m"` (SmolLM2-135M-Instruct, the embedded default)."""),
    ("md", "## 1. Install\n\nOn Colab uncomment the lines for your runtime. Locally, "
           "`pip install -e .` in the repository is all you need."),
    ("code", """\
# Colab: get the code (configs/ lives in the repository, next to the package)
# !git clone https://github.com/spade-jax/spade_jax.git && pip install -q -e spade_jax
# %cd spade_jax/notebooks
# TPU runtime:  !pip install -q -U "jax[tpu]"
# GPU runtime:  !pip install -q -U "jax[cuda12]"
import importlib.util
import json
import tempfile
from pathlib import Path

import jax
import matplotlib.pyplot as plt
import numpy as np

print(f"JAX {jax.__version__} on {jax.default_backend()}, {jax.device_count()} device(s)")"""),
    ("md", "## 2. Configuration and runtime"),
    ("code", """\
MODEL = "tiny"  # or "smollm2_135m" on Colab TPU/GPU

REPO = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "configs").is_dir())
spec = importlib.util.spec_from_file_location(MODEL, REPO / "configs" / f"{MODEL}.py")
config_module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(config_module)
cfg = config_module.get_config()
cfg.total_cycles = 2
WORKDIR = Path(tempfile.mkdtemp(prefix="spade_quickstart_"))
print(f"config {MODEL}: {cfg.model.arch.n_layers} layers, d_model {cfg.model.arch.d_model}; "
      f"workdir {WORKDIR}")"""),
    ("code", """\
from spade_jax.config import parse
from spade_jax.spade.runtime import Runtime

run = parse(cfg)  # typed, checked records; a bad setting fails here, naming its key
rt = Runtime.create(run)  # model, tokenizer, sampler, optimizer state, sandbox pools
n_params = sum(x.size for x in jax.tree.leaves(rt.train_state.params))
print(f"{n_params / 1e6:.1f}M parameters on mesh {dict(rt.mesh.shape)}")"""),
    ("md", """\
## 3. The Designer writes one environment

The Designer gets a skill, the environment contract and a worked example, and answers with a
Python class. The validation gate (`spade_jax.envs.validate`) runs it in the sandbox: it must
parse, follow the contract, be deterministic, terminate, and be solvable by its own
`solution()`. Every failed check is named."""),
    ("code", """\
from spade_jax.spade import prompts

skill = run.spade.skills[0]
messages = prompts.designer_messages(
    skill, game_type=run.spade.game_type, max_turns=run.spade.max_turns,
    example_code=prompts.worked_example(rt.seed_envs, run.spade.game_type))
[design] = rt.generate([messages], run.sampling.designer, seed=0)
print(f"Designer ({len(design.tokens)} tokens, {design.finish_reason}):")
print(design.text[:1500])"""),
    ("code", """\
report = rt.validate(design.text)
print("valid:", report.ok)
for check, reason in report.failures:
    print(f"  {check}: {reason[:200]}")

if report.ok:
    env_name, env_code = "designed", report.code
else:
    # A random (or very small) model rarely writes a valid environment on its first try.
    # SPADE then trains the Agent on environments from memory; we do the same here and
    # continue with one of the seed environments that ship with spade_jax.
    seed_env = rt.seed_envs[0]
    env_name, env_code = seed_env.name, seed_env.code
    print(f"The design was rejected; falling back to the seed environment {env_name!r}.")
    print("seed environment valid:", rt.validate(env_code).ok)"""),
    ("md", """\
## 4. The Agent plays it, without and with a hint

`ENV_HINT` asks the environment's own `hint()` for each seed (hints that contain the
solution are dropped). The regret of an environment is how much the hint helps."""),
    ("code", """\
from spade_jax.spade.envrunner import ENV_HINT
from spade_jax.spade.rollout import EpisodeSpec

seeds = range(run.spade.plays_per_env)
specs = [EpisodeSpec(env_name, env_code, seed) for seed in seeds]
specs += [EpisodeSpec(env_name, env_code, seed, hint=ENV_HINT) for seed in seeds]
episodes = rt.play(specs, run.sampling.agent, seed=0)
no_hint = [e.episode_return for e in episodes if e.spec.hint is None]
with_hint = [e.episode_return for e in episodes if e.spec.hint is not None]
print(f"return without hint {np.mean(no_hint):+.3f}, with hint {np.mean(with_hint):+.3f}, "
      f"regret {np.mean(with_hint) - np.mean(no_hint):+.3f}")
first = episodes[len(episodes) // 2]
print("hint shown:", first.hint)
print(rt.tokenizer.decode(first.tokens.tolist())[-1200:])"""),
    ("md", """\
## 5. Two SPADE cycles

Each cycle: the Designer writes environments for a window of skills (grounded in a document
from the corpus, with examples from memory), the gate validates them, the Agent plays each
K times with and K times without a hint, the Designer is rewarded by regret, and one
policy-gradient step trains both roles. Checkpoints, metrics and every environment land in
the workdir."""),
    ("code", """\
from spade_jax.spade.driver import run_training

history = run_training(cfg, str(WORKDIR), runtime=rt, resume=False)
print(sorted(p.name for p in WORKDIR.iterdir()))"""),
    ("md", "## 6. Regret and returns"),
    ("code", """\
rows = [json.loads(line) for line in (WORKDIR / "metrics.jsonl").read_text().splitlines()]
cycles = [r["cycle"] for r in rows]
value = lambda r, key: np.nan if r.get(key) is None else r[key]
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
left.plot(cycles, [value(r, "regret/mean") for r in rows], "o-")
left.set(title="mean regret", xlabel="cycle")
for key, label in (("return/nohint", "no hint"), ("return/hint", "with hint")):
    right.plot(cycles, [value(r, key) for r in rows], "o-", label=label)
right.set(title="Agent return", xlabel="cycle")
right.legend()
fig.tight_layout()
fig.savefig(WORKDIR / "curves.png")
plt.show()"""),
    ("md", """\
## 7. Evaluate on games

Every benchmark in `spade_jax.eval` is an environment under the same contract and is played by
the same rollout. Here: two seed games, without and with their hint (the full suites run with
`launch/eval.py`, e.g. `--suites=games,reasoning_gym,humaneval,bfcl_multi_turn`)."""),
    ("code", """\
from spade_jax.eval import runner

tasks = runner.build_tasks("games", limit=2, games_seeds=1,
                           games_max_turns=run.spade.max_turns)
summary = runner.evaluate(rt, tasks, WORKDIR / "eval", progress=False,
                          decoding=runner.greedy(run.sampling.agent_max_new_tokens))
for row in summary["rows"]:
    print(f"{row['category']:<36} hint={row['hint']!s:<5} mean return "
          f"{row['mean_return']:+.2f}  solved {row['solved']:.2f}")
print(f"results in {WORKDIR / 'eval'}: {sorted(p.name for p in (WORKDIR / 'eval').iterdir())}")"""),
    ("code", """\
rt.close()  # stop the sandbox workers"""),
]


def build() -> nbformat.NotebookNode:
    """The notebook object of CELLS."""
    notebook = nbformat.v4.new_notebook()
    notebook.metadata.update(
        kernelspec={"name": "python3", "display_name": "Python 3", "language": "python"},
        language_info={"name": "python"},
        accelerator="TPU",
        colab={"provenance": []},
    )
    make = {"md": nbformat.v4.new_markdown_cell, "code": nbformat.v4.new_code_cell}
    notebook.cells = [make[kind](source) for kind, source in CELLS]
    for i, cell in enumerate(notebook.cells):
        cell["id"] = f"cell-{i:02d}"
    return notebook


def main() -> None:
    nbformat.write(build(), NOTEBOOK)
    print(f"wrote {NOTEBOOK}")


if __name__ == "__main__":
    main()
