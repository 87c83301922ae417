"""Memory plan: topology names, per-device bytes from real shardings, the CLI."""

import dataclasses
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from spade_jax.compiled_plan import CompiledPlan, compiled_max_rollout_batch
from spade_jax.errors import ConfigError
from spade_jax.models.config import ModelConfig
from spade_jax.plan import (
    TrainShape,
    _topology_dims,
    format_plan,
    max_rollout_batch,
    memory_plan,
    topology_devices,
    tpu_topology_devices,
)
from spade_jax.sampling import DecodeWeights
from spade_jax.sharding import make_mesh

CFG = ModelConfig(vocab_size=1024, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4,
                  head_dim=32, ffn_dim=512, tie_embeddings=True, family="llama")
SHAPE = TrainShape(param_dtype="float32", compute_dtype="bfloat16", mesh=(1, 4, 2),
                   remat="block", micro_batch=8, seq_len=128, rollout_batch=16, context_len=256)


def test_topologies():
    assert topology_devices("v5p-64") == (32, 95.0)
    assert topology_devices("v5e-16") == (16, 16.0)
    assert topology_devices("v6e-8") == (8, 32.0)
    assert topology_devices("v4-128") == (64, 32.0)
    with pytest.raises(ConfigError, match="unknown topology"):
        topology_devices("h100-8")


def test_tpu_topology_shapes_and_devices():
    """v5p/v4 slices are 3-D chip grids, v5e/v6e 2-D; with libtpu the topology's devices are
    TPUs (no TPU attached), without it the plan says what to install."""
    assert _topology_dims(32, 3) == [2, 4, 4] and _topology_dims(64, 3) == [4, 4, 4]
    assert _topology_dims(4, 3) == [2, 2, 1] and _topology_dims(8, 3) == [2, 2, 2]
    assert _topology_dims(16, 2) == [4, 4]
    assert _topology_dims(128, 2) == [8, 16]
    with pytest.raises(ConfigError, match="power of two"):
        _topology_dims(24, 3)
    if importlib.util.find_spec("libtpu") is None:
        with pytest.raises(ConfigError, match=r"pip install -e \.\[tpu\]"):
            tpu_topology_devices("v5p-64")
    else:
        devices = tpu_topology_devices("v5p-64")
        assert len(devices) == 32 and {d.platform for d in devices} == {"tpu"}
        # one device per chip on v4 too (megacore), as JAX's TPU meshes need
        v4 = tpu_topology_devices("v4-64")
        assert len(v4) == 32 and len({tuple(d.coords) for d in v4}) == 32
        assert make_mesh((1, 4, 8), v4).devices.size == 32


def test_parameter_bytes_follow_the_shardings():
    plan = memory_plan(CFG, SHAPE)
    # Every matrix here divides (fsdp=4, tensor=2); only norms [L, D] / [D] are replicated.
    norms = 2 * 4 * 256 + 256
    matrices = plan.n_params - norms
    local = matrices // 8 + norms
    assert plan.parameters == local * 4  # float32 masters
    assert plan.optimizer == 2 * local * 4  # both Adam moments in float32
    assert plan.gradients == local * 4  # float32 gradient sums
    assert plan.sampler_weights == local * 2  # the sampler's bf16 copy
    assert plan.reference_weights == 0  # KL off
    kl = memory_plan(CFG, TrainShape(**{**SHAPE.__dict__, "reference_copy": True}))
    assert kl.reference_weights == local * 2
    assert kl.sampling_peak - plan.sampling_peak == local * 2
    assert kl.training_peak - plan.training_peak == local * 2
    same = memory_plan(CFG, TrainShape(**{**SHAPE.__dict__, "compute_dtype": "float32"}))
    assert same.sampler_weights == 0  # float32 sampling shares the master weights
    # KV cache: 2 x [L=4, B=16/4, S=256, K=4/2, Dh=32] in bf16.
    assert plan.kv_cache == 2 * 4 * 4 * 256 * 2 * 32 * 2
    # 4 KV heads on tensor=8 cannot split: the batch is split 32 ways instead of replicated.
    wide = memory_plan(CFG, TrainShape(**{**SHAPE.__dict__, "mesh": (1, 4, 8),
                                          "rollout_batch": 64}))
    assert wide.kv_cache == 2 * 4 * (64 // 32) * 256 * 4 * 32 * 2
    assert plan.kv_row_copy == wide.kv_row_copy == 0  # the batch is split: no row subsets
    # One device: a session's row-subset programs copy at most half the cache's rows.
    one = memory_plan(CFG, TrainShape(**{**SHAPE.__dict__, "mesh": (1, 1, 1)}))
    assert one.kv_row_copy == one.kv_cache // 2
    assert one.sampling_peak == one.resident + one.kv_cache + one.kv_row_copy
    no_remat = memory_plan(CFG, TrainShape(**{**SHAPE.__dict__, "remat": "none"}))
    assert no_remat.activations > plan.activations
    assert "fits" in format_plan(CFG, SHAPE, plan, hbm_gib=16)
    assert "does NOT fit" in format_plan(CFG, SHAPE, plan, hbm_gib=1e-4)


MOE_CFG = ModelConfig(vocab_size=1024, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4,
                      head_dim=32, ffn_dim=512, qk_norm=True, n_experts=8, n_experts_per_tok=2,
                      expert_ffn_dim=128, family="qwen3_moe")


def test_the_decode_holds_the_experts_gathered_unless_it_gathers_them_per_step():
    """The TPU compiler hoists the gathers of the experts' weights over fsdp out of the decode
    loop: the sampling peak counts every layer's experts, split over tensor (half of them on
    each of the 2 ranks here) and gathered over fsdp, in bf16; gathered per step, two layers'
    of them; nothing for a dense model or without fsdp."""
    plan = memory_plan(MOE_CFG, SHAPE)
    experts = 4 * 3 * (8 // 2) * 256 * 128 * 2  # layers x (gate, up, down) x experts x D x F
    assert plan.decode_gathered_weights == experts
    assert plan.sampling_peak == plan.resident + plan.kv_cache + experts
    per_step = memory_plan(MOE_CFG, dataclasses.replace(
        SHAPE, decode_weights=DecodeWeights.PER_STEP))
    assert per_step.decode_gathered_weights == experts // 2
    assert memory_plan(MOE_CFG, dataclasses.replace(
        SHAPE, mesh=(1, 1, 8))).decode_gathered_weights == 0
    assert memory_plan(CFG, SHAPE).decode_gathered_weights == 0


def test_per_step_decode_weights_are_offered_where_the_gathered_experts_do_not_fit():
    """30B at 32k on v5litepod-256: its decode's gathered experts (6.75 GiB per chip) take the
    sampling peak past 16 GiB; gathered per step the same mesh fits."""
    from spade_jax.plan import GIB, format_alternatives, per_step_alternative

    run = _recipe_at("30b", 32768)
    plan = per_step_alternative(run, 256, 16 * GIB)
    assert plan is not None and plan.peak == plan.sampling_peak < 11 * GIB
    assert format_alternatives(run, 256, 16).splitlines()[-1] == (
        "with each decode step gathering the weights, a slower decode (check with --compiled): "
        "--config.sampling.decode_weights=per_step: 10.9 GiB")
    assert per_step_alternative(run, 256, 10 * GIB) is None
    assert per_step_alternative(run, 4, 10_000 * GIB) is None  # tensor 8 cannot split 4 chips
    # the slice tables try the other tensor widths first, then the per-step decode weights
    found = list(_plan_tables().alternatives(run, 256, 16 * GIB))
    assert [name for name, _, _ in found] == ["tensor 16", "per-step decode weights"]
    assert found[1][1].sampling.decode_weights is DecodeWeights.PER_STEP
    assert found[1][2] == plan


def test_largest_rollout_batch_is_the_last_multiple_that_fits():
    """The largest sampler batch fits HBM in the sampling phase and one more step of the
    batch's shards (here fsdp 4 x tensor 2: the 4 KV heads are split 2 ways, so the batch
    over data x fsdp) does not."""
    budget = memory_plan(CFG, SHAPE).sampling_peak * 3
    largest = max_rollout_batch(CFG, SHAPE, budget)
    assert largest % 4 == 0 and largest > SHAPE.rollout_batch
    fits = memory_plan(CFG, dataclasses.replace(SHAPE, rollout_batch=largest))
    over = memory_plan(CFG, dataclasses.replace(SHAPE, rollout_batch=largest + 4))
    assert fits.sampling_peak <= budget < over.sampling_peak
    assert max_rollout_batch(CFG, SHAPE, fits.resident - 1) == 0


def test_compiled_largest_rollout_batch_adds_exact_cache_rows_to_the_compiled_peak():
    """From a plan compiled at the config's batch of 16 rows, each further 4 rows (the cache's
    batch shards) add their KV cache bytes; the largest batch is the last such step within
    HBM, below the compiled batch when the compiled peak is over it, and 0 when nothing fits."""
    per_step = memory_plan(CFG, dataclasses.replace(SHAPE, rollout_batch=4)).kv_cache
    plan = CompiledPlan(layers=4, compiled_layers=4, platform="tpu",
                        program_peaks={"sampler.extend": (1000 * per_step, None),
                                       "sampler.decode": (900 * per_step, None),
                                       "train_step": (5000 * per_step, None)},
                        parameters=3 * per_step, optimizer=6 * per_step, sampler_weights=0,
                        reference_weights=0)
    assert plan.sampling_peak == 1006 * per_step  # the extend, the optimizer (no copy)
    assert compiled_max_rollout_batch(plan, CFG, SHAPE, 1006 * per_step) == 16
    assert compiled_max_rollout_batch(plan, CFG, SHAPE, 1009 * per_step + 1) == 16 + 3 * 4
    assert compiled_max_rollout_batch(plan, CFG, SHAPE, 1004 * per_step) == 16 - 2 * 4
    assert compiled_max_rollout_batch(plan, CFG, SHAPE, 1004 * per_step - 1) == 16 - 3 * 4
    assert compiled_max_rollout_batch(plan, CFG, SHAPE, 100 * per_step) == 0


def test_cli_prints_a_verdict():
    result = subprocess.run(
        [sys.executable, "-m", "spade_jax.plan", "--config=configs/30b.py", "--topology=v5p-64"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "optimizer (AdamW)" in result.stdout and "verdict:" in result.stdout
    assert "other meshes" not in result.stdout  # it fits: no alternatives offered


def _recipe_at(name: str, context: int):
    from spade_jax.config import load_config_file, parse

    cfg = load_config_file(name)
    cfg.train.seq_len = cfg.sampling.max_context = context
    return parse(cfg)


def test_other_tensor_widths_are_offered_where_the_recipes_mesh_does_not_fit():
    """8B's FSDP-only mesh does not fit 16 GiB v5e chips at 32k tokens on 256 chips (a whole
    32k-token row of activations per chip); the alternatives are the other tensor widths that
    do, fsdp filling the rest, lowest peak first, ties to the narrower width."""
    from spade_jax.plan import GIB, plan_from_config, tensor_alternatives

    run = _recipe_at("8b", 32768)
    cfg, shape = plan_from_config(run, 256)
    hbm = 16 * GIB
    assert shape.mesh == (1, 256, 1) and memory_plan(cfg, shape).peak > hbm
    found = tensor_alternatives(run, 256, hbm)
    assert [t for t, _, _ in found] == [4, 8, 2, 16]
    for tensor, shape, plan in found:
        assert shape.mesh == (1, 256 // tensor, tensor)
        assert plan.peak <= hbm and plan == memory_plan(cfg, shape)
    assert [p.peak for _, _, p in found] == sorted(p.peak for _, _, p in found)
    assert tensor_alternatives(run, 256, 10 * GIB) == []  # none fits 10 GiB
    # 30B's rule (tensor 8) cannot split 4 chips; the widths that can are still offered
    small = tensor_alternatives(_recipe_at("30b", 2048), 4, 10_000 * GIB)
    assert sorted(t for t, _, _ in small) == [1, 2, 4]


def _plan_tables():
    """bench/plan_tables.py as a module."""
    spec = importlib.util.spec_from_file_location(
        "plan_tables", Path(__file__).parents[2] / "bench" / "plan_tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    return tables


def test_cli_and_table_name_the_tensor_width_that_fits():
    """`plan` prints the alternatives after a refusal; the slice table's cell names the mesh
    where it is not the recipe's."""
    result = subprocess.run(
        [sys.executable, "-m", "spade_jax.plan", "--config=configs/8b.py", "--topology=v5e-256",
         "--config.sampling.max_context=32768", "--config.train.seq_len=32768"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "verdict: does NOT fit" in result.stdout
    assert ("other meshes the analytic plan fits (check with --compiled): "
            "--config.mesh.tensor=4 (mesh (1, 64, 4)): 10.6 GiB") in result.stdout
    tables = _plan_tables()
    assert tables.smallest_fit("8b", 32768, "v5e").startswith("v5litepod-256 (tensor 4): 10.6")
    assert tables.smallest_fit("8b", 8192, "v5e").startswith("v5litepod-64: 12.0 GiB")


def test_rollout_check_passes_the_cpu_default_and_refuses_too_many_plays():
    from spade_jax.config import load_config_file, parse
    from spade_jax.plan import GIB, check_rollout_fits

    cfg = load_config_file("smollm2_135m")
    check_rollout_fits(parse(cfg), 1, 24 * GIB)  # the README's main job on a 24 GiB laptop
    # (64 + 64) x 3 = 384 conversations; each 2 x 30 layers x 4096 x 3 kv heads x 64 x 4 B
    # = 180 MiB
    cfg.spade.plays_per_env = cfg.spade.hint_plays_per_env = 64
    with pytest.raises(ConfigError) as err:
        check_rollout_fits(parse(cfg), 1, 24 * GIB)
    message = str(err.value)
    assert "spade.plays_per_env=64 + spade.hint_plays_per_env=64" in message
    assert "384 conversations" in message
    assert "need 67.5 GiB of KV cache" in message and "1.5 GiB of parameters" in message
    assert "(and 33.8 GiB for a copy of half its rows)" in message  # one device: row subsets
    assert "At most 85 conversations fit" in message  # (24 GiB - 1.5 GiB) / (1.5 x 180 MiB)


def test_kl_without_room_for_its_reference_copy_is_refused_with_the_numbers():
    """smollm2-135m at bf16 compute on one device: 0.50 GiB float32 masters + 1.00 GiB
    moments + 0.25 GiB sampler copy + 2.11 GiB bf16 KV cache for its 24 plays + 1.05 GiB for
    a copy of half its rows = 4.91 GiB; KL's bf16 reference adds 0.25 GiB (5.16 GiB)."""
    from spade_jax.config import load_config_file, parse
    from spade_jax.plan import GIB, check_rollout_fits

    cfg = load_config_file("smollm2_135m")
    cfg.model.compute_dtype = "bfloat16"
    check_rollout_fits(parse(cfg), 1, 5 * GIB)  # fits without KL
    cfg.train.kl_coef = 0.005
    check_rollout_fits(parse(cfg), 1, int(5.2 * GIB))  # and with it, given room
    with pytest.raises(ConfigError) as err:
        check_rollout_fits(parse(cfg), 1, 5 * GIB)
    message = str(err.value)
    assert message.startswith("train.kl_coef=0.005 needs a frozen reference copy")
    assert "0.3 GiB per device in bfloat16" in message
    assert "holds 5.2 GiB while sampling" in message and "but has 5.0 GiB" in message
    assert "KV cache 2.1 GiB for 24 conversations, a copy of half its rows 1.1 GiB" in message


def test_a_run_asking_for_more_plays_than_memory_holds_stops_before_loading(tmp_path):
    from spade_jax.config import load_config_file
    from spade_jax.spade.driver import run_training

    cfg = load_config_file("tiny")
    cfg.spade.plays_per_env = 1_000_000
    with pytest.raises(ConfigError, match="the Agent's plays do not fit in memory"):
        run_training(cfg, str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()  # refused before the model, the pool or a file


def _small_run(layers: int, *, head_dim: int = 32, mesh=(1, 4, 2), context: int = 1024,
               plays: int = 2):
    """A config whose decoder layers weigh in the programs' memory (d_model 256, vocab 1024),
    by default on a (1, 4, 2) mesh of the 8 fake CPU devices, with bf16 compute (a sampler
    copy); its rollout batch is 4 environments x (`plays` + 2 hint plays)."""
    from spade_jax.config import load_config_file, parse
    from spade_jax.defaults import arch

    c = load_config_file("tiny")
    c.model.arch = arch(vocab_size=1024, d_model=256, n_layers=layers, n_heads=8, n_kv_heads=4,
                        head_dim=head_dim, ffn_dim=1024, rope_theta=10000.0, rms_eps=1e-5,
                        tie_embeddings=True, family="llama")
    c.model.compute_dtype = "bfloat16"
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = mesh
    c.train.seq_len = 256
    c.sampling.max_context = context
    c.spade.plays_per_env = plays
    return parse(c)


@pytest.mark.slow  # 9 programs compiled
def test_compiled_plan_is_exact_at_depth_and_extrapolates_within_10_percent():
    """By default the plan compiles each program at the config's depth (4 layers here), so its
    peaks are XLA's for the programs a run compiles. Compiled at 2 and 3 layers instead, its
    extrapolation to 4 layers is within 10 % of them, where the 4-layer programs are more than
    10 % larger than the 2-layer ones; the resident state is the full-depth state's shards
    (float32 masters, two float32 moments, the bf16 sampler copy)."""
    from spade_jax.compiled_plan import SAMPLER_PROGRAMS, compiled_plan

    run = _small_run(layers=4)
    exact = compiled_plan(run, 8)
    quick = compiled_plan(run, 8, layers=2)
    assert (exact.layers, exact.compiled_layers, quick.compiled_layers) == (4, 4, 2)
    assert set(exact.program_peaks) == set(quick.program_peaks) == {"train_step",
                                                                    *SAMPLER_PROGRAMS}
    for name, (peak, per_layer) in exact.program_peaks.items():
        assert per_layer is None and exact.program_peak(name) == peak
        assert quick.program_peak(name) == pytest.approx(peak, rel=0.10), name
        assert peak > 1.1 * quick.program_peak(name, 2), name  # a flat plan would be off
    with pytest.raises(ValueError, match="compiled at 4 layers only"):
        exact.program_peak("train_step", 2)
    with pytest.raises(ValueError, match="at least 2"):
        compiled_plan(run, 8, layers=1)
    for plan in (exact, quick):
        # two float32 moments of the float32 masters (and optax's step counters)
        assert 0 <= plan.optimizer - 2 * plan.parameters < 64
        assert plan.sampler_weights == plan.parameters // 2  # the bf16 copy
        assert plan.reference_weights == 0  # KL off
        assert plan.sampling_peak == max(plan.program_peak(n) for n in SAMPLER_PROGRAMS) + \
            plan.optimizer + plan.parameters
        assert plan.training_peak == plan.program_peak("train_step") + plan.sampler_weights


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                    reason="needs libtpu: pip install -e .[tpu]")
def test_a_program_the_tpu_compiler_refuses_is_reported_as_not_fitting():
    """64 conversations of 262,144 slots on a v5e-4 (16 GiB chips): the TPU compiler refuses
    the extend (RESOURCE_EXHAUSTED, its temporaries alone over the chip's HBM). The compiled
    plan goes on, names the program with the compiler's words and its figure as a lower bound,
    and says the config does not fit, where it used to die with the compiler's error."""
    from spade_jax.compiled_plan import compiled_plan, format_compiled_plan
    from spade_jax.plan import GIB

    run = _small_run(layers=2, head_dim=128, mesh=(1, 4, 1), context=262144, plays=14)
    assert run.rollout_batch == 64
    plan = compiled_plan(run, 4, tpu_topology_devices("v5e-4"))
    assert "RESOURCE_EXHAUSTED" in plan.refused["sampler.extend"]
    assert "train_step" not in plan.refused
    assert plan.program_peak("sampler.extend") > 16 * GIB
    assert not plan.fits(16 * GIB)
    report = format_compiled_plan(plan, 16)
    assert "sampler.extend  >= " in report and "refused by the compiler" in report
    assert "verdict (compiled): does NOT fit (>= " in report


def test_readiness_pads_the_rollout_batch_as_a_session_does():
    """With 4 KV heads on tensor = 8 the cache's batch is split over every axis (8 ways): the
    12 conversations are lowered as 16 rows, as `Session` pads them, not as 12 rows that the
    cache could only hold replicated (on 256 chips that made the 30B decode's cache 36 GiB per
    device at 16k slots instead of 0.2)."""
    from spade_jax.readiness import check

    run = _small_run(layers=2, mesh=(1, 1, 8), plays=1)
    assert run.rollout_batch == 12
    _, summary = check(run, 8, layers=None, seq_len=None, micro_batches=1,
                       programs=("sampler.decode",), compile_programs=False)
    assert summary["rollout_batch"] == 16
