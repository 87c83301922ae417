"""The training driver: set up, resume, run cycles, checkpoint, log, summarise.

`run_training` is what `launch/train.py` calls. A run is resumable at every checkpoint: device
state and all host state (memory, environment pool, blacklist, learning-potential trackers,
cycle counter, metric history) are saved together, and every random draw of a cycle is derived
from (seed, cycle), so a resumed run continues exactly as an uninterrupted one would.
"""

from __future__ import annotations

import logging
import time

import jax
from etils import epath
from tqdm import tqdm

from spade_jax import config as config_lib
from spade_jax import plan
from spade_jax.checkpoint import Checkpointer
from spade_jax.config import MemoryConfig
from spade_jax.distributed import is_main_process
from spade_jax.errors import ConfigError
from spade_jax.eval.runner import in_loop_tasks, run_in_loop_eval
from spade_jax.metrics import MetricsWriter, PhaseTimer
from spade_jax.spade.artifacts import Artifacts
from spade_jax.spade.corpus import load_corpus
from spade_jax.spade.loop import HostState, run_cycle, summarize
from spade_jax.spade.memory import EnvMemory
from spade_jax.workdir import check_writable, enable_compilation_cache, write_text_atomic


def fresh_state(memory_config: MemoryConfig, seed_envs) -> HostState:
    """Cycle 0: memory seeded from our seed environments, no pool yet."""
    memory = EnvMemory(capacity=memory_config.capacity, mode=memory_config.mode,
                       staleness_coef=memory_config.staleness_coef)
    memory.seed_from((e.name, e.skill, e.code) for e in seed_envs)
    return HostState(cycle=0, memory=memory, pool=[])


CONFIG_FILE = "config.json"


def write_config(cfg, workdir: str) -> str:
    """Record the run's config as `<workdir>/config.json` (read back by launch/export.py)."""
    directory = epath.Path(workdir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / CONFIG_FILE
    write_text_atomic(path, cfg.to_json_best_effort(indent=2))
    return str(path)


def run_training(cfg, workdir: str, *, resume: bool = True, runtime=None,
                 time_budget_s: float | None = None,
                 compile_cache: str | None = None) -> list[dict]:
    """Train for `cfg.total_cycles` cycles in `workdir`; returns the per-cycle metrics.

    `cfg` (the ConfigDict of a config file) is parsed here, once, into a `RunConfig`; only
    its records travel further.

    A `runtime` may be passed in (tests share one across runs); it is then left open. With
    `time_budget_s`, no new cycle starts once that many seconds have passed (the cycle in
    progress finishes and is checkpointed): "train for an hour" on a laptop. With
    `compile_cache` (a local or gs:// directory), JAX's persistent compilation cache is on from
    the moment the model is loaded (so a config that fails to load leaves no workdir behind).
    """
    started = time.monotonic()
    from spade_jax.spade.runtime import Runtime, fixed_pool_categories, fixed_pool_files

    n_devices = runtime.mesh.size if runtime is not None else jax.device_count()
    run = config_lib.parse(cfg, n_devices)
    plan.check_rollout_fits(run, n_devices, plan.device_memory_bytes())
    check_writable(workdir)
    if not run.mode.designs:  # a pool that cannot be built fails before the model loads
        fixed_pool_files(run.fixed_pool)
        fixed_pool_categories(run.fixed_pool)
    main = is_main_process()
    corpus = None  # read before the model is loaded: a bad corpus fails in seconds
    if run.mode.designs and not run.spade.no_corpus:
        corpus = load_corpus(run.corpus.source, max_words=run.corpus.max_words,
                             tfds_data_dir=run.corpus.data_dir or None)
    try:  # bad in-loop eval settings fail before the model loads too
        eval_tasks = in_loop_tasks(run.eval, run.spade.max_turns)
    except (ValueError, ImportError) as err:
        raise ConfigError(f"eval: {err}") from err
    rt = runtime or Runtime.create(run)
    owns_runtime = runtime is None
    cache = enable_compilation_cache(compile_cache) if compile_cache else None
    checkpointer = Checkpointer(workdir, keep=run.keep_checkpoints)
    state, history = fresh_state(run.memory, rt.seed_envs), []
    latest = checkpointer.latest_step() if resume else None
    if latest is not None:
        device_state, host = checkpointer.restore(latest, rt.device_state())
        rt.set_device_state(device_state)
        state, history = HostState.from_json(host["state"]), host["history"]
        logging.info("resuming at cycle %d from %s", state.cycle, checkpointer.directory)
    if main:
        write_config(cfg, workdir)
    writer = MetricsWriter(workdir, enabled=main, logging=run.logging, config=cfg.to_dict())
    artifacts = Artifacts(workdir, enabled=main)
    bar = tqdm(total=run.total_cycles, initial=state.cycle, desc="SPADE", disable=not main)
    try:
        while state.cycle < run.total_cycles:
            if time_budget_s is not None and time.monotonic() - started >= time_budget_s:
                logging.info("time budget of %.0f s spent after cycle %d", time_budget_s,
                             state.cycle)
                break
            cycle = state.cycle
            rt.timer = PhaseTimer()
            metrics = run_cycle(rt, run, state, corpus, artifacts)
            metrics.update(rt.timer.shares())
            metrics["throughput/tokens_per_s"] = rt.pop_tokens_per_second()
            if eval_tasks and state.cycle % run.eval.every == 0:
                eval_dir = epath.Path(workdir) / "eval" / f"cycle_{cycle:05d}" if main else None
                metrics.update(run_in_loop_eval(
                    rt, eval_tasks, eval_dir, max_new_tokens=run.sampling.agent_max_new_tokens,
                    seed=run.seed))
            writer.write(cycle, metrics)
            history.append({"cycle": cycle, **metrics})
            bar.update(1)
            bar.set_postfix({k.split("/")[-1]: round(float(metrics[k]), 3) for k in
                             ("designer/valid_rate", "regret/mean", "return/nohint")
                             if k in metrics})
            out_of_time = (time_budget_s is not None
                           and time.monotonic() - started >= time_budget_s)
            if (state.cycle % run.checkpoint_every == 0 or state.cycle == run.total_cycles
                    or out_of_time):
                checkpointer.save(state.cycle, rt.device_state(),
                                  {"state": state.to_json(), "history": history})
    finally:
        bar.close()
        writer.close()
        checkpointer.close()
        if owns_runtime:
            rt.close()
        if cache:
            logging.info("compilation cache %s: %d hits, %d misses", compile_cache,
                         cache.counts["hits"], cache.counts["misses"])
    if main and history:
        print(summarize(history))
    return history
