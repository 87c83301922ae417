"""config.parse: one ConfigError naming every problem by key path; frozen, typed records."""

import dataclasses

import ml_collections
import pytest

from spade_jax.config import Mode, RunConfig, load_config_file, parse
from spade_jax.errors import ConfigError
from spade_jax.rl.losses import LossAggregation
from spade_jax.rl.trainer import Remat
from spade_jax.spade.hints import HintMode
from spade_jax.spade.memory import MemoryMode
from spade_jax.spade.prompts import SKILLS, TOOL_USE_SKILLS, GameType
from spade_jax.spade.rewards import RewardVariant


def tiny(**changes) -> ml_collections.ConfigDict:
    """The tiny config with `changes` ('a.b' keys) applied, any type allowed."""
    values = load_config_file("tiny").to_dict()
    for key, value in changes.items():
        *parents, name = key.split(".")
        node = values
        for parent in parents:
            node = node[parent]
        node[name] = value
    return ml_collections.ConfigDict(values)


def problems_of(cfg, n_devices: int | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse(cfg, n_devices)
    lines = str(caught.value).splitlines()
    assert lines[0] == "invalid config:"
    return [line.removeprefix("  - ") for line in lines[1:]]


def test_the_shipped_tiny_config_parses_into_typed_records():
    run = parse(load_config_file("tiny"))
    assert isinstance(run, RunConfig)
    assert run.mode is Mode.SPADE and run.spade.game_type is GameType.GAME
    assert isinstance(run.spade.reward_variant, RewardVariant)
    assert isinstance(run.memory.mode, MemoryMode) and isinstance(run.train.remat, Remat)


def test_every_problem_is_reported_at_once_with_its_key_path():
    found = problems_of(tiny(**{"spade.reward_variant": "best", "memory.capacity": 0,
                                "sampling.max_context": 0, "sandbox.step_timeout_s": 0.0}))
    assert len(found) == 4, found
    assert "sandbox.step_timeout_s=0.0 must be > 0" in found
    assert any(p.startswith("spade.reward_variant='best'") for p in found), found
    assert "memory.capacity=0 must be >= 1" in found
    assert "sampling.max_context=0 must be >= 1" in found


def test_counts_and_mesh_axes_that_would_crash_a_run_are_refused():
    """A checkpoint interval of 0 divided by zero after the first cycle, and a mesh axis of 0
    in the mesh's shape; a negative temperature, cycle count or eval interval was accepted."""
    found = problems_of(tiny(**{
        "total_cycles": -1, "checkpoint_every": 0, "keep_checkpoints": 0, "mesh.data": 0,
        "mesh.tensor": -2, "eval.every": -1, "sampling.designer_temperature": -0.5}), n_devices=8)
    assert found == [
        "total_cycles=-1 must be >= 0", "checkpoint_every=0 must be >= 1",
        "keep_checkpoints=0 must be >= 1",
        "mesh.data=0 must be >= 1, or -1 to fill with the devices left",
        "mesh.tensor=-2 must be >= 1, or -1 to fill with the devices left",
        "sampling.designer_temperature=-0.5 must be >= 0 (0: greedy)",
        "eval.every=-1 must be >= 0 (0: off)"], found
    parse(tiny(**{"total_cycles": 0, "sampling.designer_temperature": 0.0}))  # 0 is allowed


def test_the_sampler_settings_are_checked_and_reach_the_runtimes_sampler():
    """`sampling.prefill_tokens` below one bucket, an unknown `sampling.decode_weights` and
    `sampling.draft_tokens` past the decode's query block are refused; valid ones reach the
    sampler the run decodes with (its extends of one row are that wide)."""
    import jax

    from spade_jax.sampling import DecodeWeights
    from spade_jax.spade.runtime import Runtime

    assert problems_of(tiny(**{"sampling.prefill_tokens": 8})) == [
        "sampling.prefill_tokens=8 must be >= 16 (the narrowest extend)"]
    assert problems_of(tiny(**{"sampling.decode_weights": "lazy"}))[0].startswith(
        "sampling.decode_weights='lazy'")
    assert problems_of(tiny(**{"sampling.draft_tokens": 8})) == [
        "sampling.draft_tokens=8 must be in 0..7 (0: no drafts)"]
    run = parse(tiny(**{"sampling.prefill_tokens": 32, "sampling.decode_weights": "per_step",
                        "sampling.draft_tokens": 2}), 1)
    rt = Runtime.create(run, jax.devices()[:1])
    try:
        assert rt.sampler.prefill_tokens == 32 and rt.sampler.extend_width(1) == 32
        assert rt.sampler.decode_weights is DecodeWeights.PER_STEP
        assert rt.sampler.draft_tokens == 2
    finally:
        rt.close()


@pytest.mark.parametrize("wait", [-1.0, float("nan")])
def test_a_negative_step_wait_is_refused_and_inf_means_lockstep(wait):
    assert problems_of(tiny(**{"sandbox.step_wait_s": wait})) == [
        f"sandbox.step_wait_s={wait} must be >= 0 (inf: wait for every step)"]
    assert parse(tiny(**{"sandbox.step_wait_s": float("inf")})).sandbox.step_wait_s == float("inf")
    assert parse(tiny()).sandbox.step_wait_s == 1.0


@pytest.mark.parametrize("seed", [-1, 2**31, 1.5, "abc", True])
def test_a_seed_outside_the_31_bit_range_is_refused_naming_it(seed):
    assert problems_of(tiny(seed=seed)) == [f"seed={seed!r}: use an integer in [0, 2147483647]"]


@pytest.mark.parametrize("seed", [0, 3, 2**31 - 1])
def test_a_seed_in_range_is_accepted(seed):
    assert parse(tiny(seed=seed)).seed == seed


def test_tool_use_skills_follow_the_game_type():
    skills = tuple(TOOL_USE_SKILLS)[:3]
    run = parse(tiny(**{"spade.game_type": "tool_use", "spade.skills": skills}))
    assert run.spade.game_type is GameType.TOOL_USE and run.spade.skills == skills
    [problem] = problems_of(tiny(**{"spade.game_type": "game", "spade.skills": skills}))
    assert problem.startswith("spade.skills has unknown") and skills[0] in problem, problem


@pytest.mark.parametrize("game_type, skills", [("game", SKILLS), ("tool_use", TOOL_USE_SKILLS)])
def test_the_skills_default_to_every_skill_of_the_game_type(game_type, skills):
    run = parse(tiny(**{"spade.game_type": game_type}))
    assert run.spade.skills == tuple(skills) and len(run.spade.skills) == 6


def test_a_refused_game_type_is_the_only_problem_even_with_default_skills():
    [problem] = problems_of(tiny(**{"spade.game_type": "tool use"}))
    assert problem.startswith("spade.game_type='tool use': use one of"), problem


def test_the_laptop_tool_use_config_is_the_laptop_config_with_tool_use():
    games, tools = parse(load_config_file("smollm2_135m")), parse(
        load_config_file("smollm2_135m_tool_use"))
    assert tools.spade.game_type is GameType.TOOL_USE
    assert tools.spade.skills == tuple(TOOL_USE_SKILLS)
    assert tools.model == games.model and tools.train == games.train
    assert not tools.spade.self_validation and not games.spade.self_validation


@pytest.mark.parametrize("key, choices", [
    ("mode", Mode), ("train.remat", Remat), ("train.loss_aggregation", LossAggregation),
    ("spade.game_type", GameType),
    ("spade.reward_variant", RewardVariant), ("spade.hint_mode", HintMode),
    ("memory.mode", MemoryMode)])
def test_a_bad_enum_value_lists_the_choices(key, choices):
    [problem] = problems_of(tiny(**{key: "bogus"}))
    assert problem.startswith(f"{key}='bogus': use one of"), problem
    assert all(repr(choice.value) in problem for choice in choices), problem


def test_training_defaults_are_the_reference_recipes():
    """Slime's --use-tis with its --tis-clip default 2.0, KL off (30B / 4B games), per-sample
    token means summed over the global batch (Slime's default reducer)."""
    train = parse(load_config_file("tiny")).train
    assert (train.tis_cap, train.kl_coef) == (2.0, 0.0)
    assert train.loss_aggregation is LossAggregation.SAMPLE_MEAN


def test_bf16_master_weights_are_refused_with_the_fix():
    found = problems_of(tiny(**{"model.param_dtype": "bfloat16", "model.compute_dtype": "fp8"}))
    assert found[0].startswith("model.param_dtype='bfloat16': the master weights must be "
                               "'float32'") and "compute_dtype='bfloat16'" in found[0]
    assert found[1] == "model.compute_dtype='fp8': use one of ('float32', 'bfloat16')"
    for name in ("30b", "4b", "8b", "32b_dense"):
        model = parse(load_config_file(name)).model
        assert (model.param_dtype, model.compute_dtype) == ("float32", "bfloat16"), name


def test_a_non_numeric_architecture_field_is_a_problem_not_a_crash():
    found = problems_of(tiny(**{"model.arch.d_model": "abc", "memory.capacity": 0}))
    assert found == ["model.arch.d_model='abc' must be an int", "memory.capacity=0 must be >= 1"]


def test_an_unknown_architecture_field_is_a_problem_with_its_key_path():
    cfg = tiny()
    cfg.model.arch.bogus = 1
    [problem] = problems_of(cfg)
    assert problem.startswith("model.arch: ") and "bogus" in problem, problem


def test_records_are_frozen():
    run = parse(load_config_file("tiny"))
    records = [run] + [getattr(run, f.name) for f in dataclasses.fields(run)
                       if dataclasses.is_dataclass(getattr(run, f.name))]
    assert len(records) == 11  # the run and its 10 sections
    records.append(run.model.arch)
    for record in records:
        field = dataclasses.fields(record)[0].name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(record, field, getattr(record, field))


def test_every_config_file_parses():
    from spade_jax.config import CONFIGS_DIR

    names = sorted(p.stem for p in CONFIGS_DIR.glob("*.py"))
    assert {"30b", "30b_tool_use", "4b", "8b", "tiny", "smollm2_135m"} <= set(names)
    for name in names:
        parse(load_config_file(name))


def test_the_rollout_batch_holds_the_largest_cycle_a_short_pool_can_play():
    """With fill_batch, fewer environments each play more; the sampler must hold the worst
    case: here 4 environments x (ceil(32 / 4) + 2 hint plays) = 40 conversations."""
    base = {"spade.games_per_cycle": 4, "spade.replay_per_cycle": 0,
            "spade.plays_per_env": 2, "spade.hint_plays_per_env": 2,
            "spade.global_batch_size": 32}
    filled = parse(tiny(**base, **{"spade.fill_batch": True}))
    assert [filled.spade.no_hint_plays(n) for n in (1, 2, 3, 4)] == [32, 16, 11, 8]
    assert filled.rollout_batch == 40
    assert parse(tiny(**base, **{"spade.fill_batch": False})).rollout_batch == 4 * (2 + 2)
    assert parse(load_config_file("30b")).rollout_batch == 24 * (8 + 16)
