"""SmolLM2-135M-Instruct learning curves on a laptop CPU: fixed-environment mode, then SPADE mode.

    python bench/learning_curves.py [--minutes 60] [--workdir runs/learning_curves]
                                    [--eval-seeds 4] [--out docs/learning_curves.png]

Both phases start from the same pretrained weights (configs/smollm2_135m.py) and get half of
`--minutes` each: `fixed` trains the Agent on our seed game environments (the paper's fixed
environment baseline), `spade` runs the full loop with the Designer writing environments.
Cycles stop starting once a phase's time is spent. Before training and after each phase the
Agent is scored greedily, without hints, on held-out seeds 0..eval_seeds-1 of the same seed
games (training episodes use counter-derived 31-bit seeds, `spade.loop.episode_seed`).

Writes the figure (return vs cycle with and without hint, regret, valid-design rate, held-out
score before/after) and `<out>.json` with every number, and prints a markdown table. Phases
resume from their workdirs, so an interrupted run continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("fixed", "spade")
CURVES = (("return/nohint", "return, no hint"), ("return/hint", "return, with hint"),
          ("regret/mean", "regret"), ("designer/valid_rate", "valid-design rate"))


def phase_config(mode: str, config: str):
    """The run config of one phase: the CPU default with `mode`, cycles bounded by time only."""
    from spade_jax.config import load_config_file

    cfg = load_config_file(config)
    cfg.mode = mode
    cfg.total_cycles = 10_000
    return cfg


def held_out_score(rt, run, eval_seeds: int, out_dir: Path) -> dict:
    """Greedy no-hint mean return per seed game on seeds 0..eval_seeds-1 (resumable).

    `run` is the phase's `RunConfig`."""
    from spade_jax.eval.report import SUITE_MEAN
    from spade_jax.eval.runner import build_tasks, evaluate, greedy

    tasks = build_tasks("games", games_seeds=eval_seeds, games_max_turns=run.spade.max_turns)
    summary = evaluate(rt, tasks, out_dir, decoding=greedy(run.sampling.agent_max_new_tokens),
                       with_hints=False, seed=run.seed, progress=True)
    means = {row["category"]: row["mean_return"] for row in summary["rows"] if not row["hint"]}
    return {"mean": means.pop(SUITE_MEAN), "per_game": means, "episodes": len(tasks)}


def plot(results: dict, path: Path) -> None:
    """Four panels of per-cycle curves for both phases plus the held-out bar chart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 4))
    for phase in PHASES:
        history = results[phase]["history"]
        cycles = [row["cycle"] for row in history]
        for key, label in CURVES[:2]:
            style = "-" if key.endswith("nohint") else "--"
            axes[0].plot(cycles, [row.get(key) for row in history], style, marker="o",
                         label=f"{phase}: {label}")
        for ax, (key, label) in zip(axes[1:3], CURVES[2:], strict=True):
            ax.plot(cycles, [row.get(key, float("nan")) for row in history], marker="o",
                    label=phase)
            ax.set_title(label)
    axes[0].set_title("training return per cycle")
    names = ["before"] + [f"after {phase}" for phase in PHASES]
    scores = [results["before"]["mean"]] + [results[p]["after"]["mean"] for p in PHASES]
    axes[3].bar(names, scores, color=["grey", "tab:blue", "tab:orange"])
    axes[3].set_title(f"held-out seeds: mean return ({results['before']['episodes']} episodes)")
    for ax in axes[:3]:
        ax.set_xlabel("cycle")
        ax.legend(fontsize=7)
    fig.suptitle(f"configs/{results['config']}.py ({results['model']}), {results['cpus']} CPU "
                 f"cores, {results['minutes']:g} min")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def table(results: dict) -> str:
    """Markdown: held-out score before/after and the last cycle's figures of each phase."""
    lines = ["| phase | cycles | minutes | held-out return before | after | last-cycle return "
             "(no hint / hint) | last regret | designs valid |",
             "|---|---|---|---|---|---|---|---|"]
    before = results["before"]["mean"]
    for phase in PHASES:
        res = results[phase]
        history = res["history"]
        last = history[-1] if history else {}
        valid = [row["designer/valid_rate"] for row in history if "designer/valid_rate" in row]
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        lines.append(
            f"| {phase} | {len(history)} | {res['minutes']:.1f} | {fmt(before)} | "
            f"{fmt(res['after']['mean'])} | {fmt(last.get('return/nohint'))} / "
            f"{fmt(last.get('return/hint'))} | {fmt(last.get('regret/mean'))} | "
            f"{fmt(sum(valid) / len(valid)) if valid else '-'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="both phases together")
    parser.add_argument("--workdir", default=str(ROOT / "runs" / "learning_curves"))
    parser.add_argument("--eval-seeds", type=int, default=4, help="held-out seeds per game")
    parser.add_argument("--config", default="smollm2_135m")
    parser.add_argument("--out", default=str(ROOT / "docs" / "learning_curves.png"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    from spade_jax.config import parse
    from spade_jax.spade.driver import run_training
    from spade_jax.spade.runtime import Runtime

    workdir, out = Path(args.workdir), Path(args.out)
    results: dict = {"minutes": args.minutes, "config": args.config, "cpus": os.cpu_count(),
                     "model": phase_config("fixed", args.config).model.source}
    for phase in PHASES:
        cfg = phase_config(phase, args.config)
        run = parse(cfg)
        rt = Runtime.create(run)  # fresh pretrained weights for each phase
        try:
            if "before" not in results:
                results["before"] = held_out_score(rt, run, args.eval_seeds,
                                                   workdir / "eval_before")
            started = time.monotonic()
            history = run_training(cfg, str(workdir / phase), runtime=rt,
                                   time_budget_s=args.minutes * 60 / len(PHASES))
            minutes = (time.monotonic() - started) / 60
            after = held_out_score(rt, run, args.eval_seeds, workdir / f"eval_after_{phase}")
        finally:
            rt.close()
        results[phase] = {"history": history, "minutes": minutes, "after": after}
        print(f"{phase}: {len(history)} cycles in {minutes:.1f} min; held-out return "
              f"{results['before']['mean']:.3f} -> {after['mean']:.3f}", flush=True)
    plot(results, out)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=float))
    print(table(results))
    print(f"wrote {out} and {out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
