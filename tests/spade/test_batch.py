import json

import numpy as np
import pytest

from spade_jax.spade.batch import (
    TrainSample,
    assemble_batch,
    bucket_length,
    drop_zero_advantage,
    fill_indices,
    length_groups,
    order_for_training,
    plays_to_fill,
)


def sample(role, n, gen, adv=1.0, weight=1.0):
    mask = np.zeros(n, bool)
    mask[n - gen:] = True
    return TrainSample(tokens=np.arange(1, n + 1, dtype=np.int32), loss_mask=mask,
                       behaviour_logp=np.where(mask, -0.5, 7.0).astype(np.float32),
                       advantage=adv, role=role, weight=weight)


def test_designer_samples_come_first_and_survive_trim():
    samples = [sample("agent", 5, 2) for _ in range(6)] + [sample("designer", 9, 4)]
    ordered = order_for_training(samples, max_samples=3)
    assert [s.role for s in ordered] == ["designer", "agent", "agent"]


@pytest.mark.parametrize("n_envs, plays", [
    (24, 8), (23, 9), (20, 10), (7, 28), (1, 192),  # reference ceil(192 / games), golden
    (30, 8),  # more environments than the batch needs: never fewer than plays_per_env
    (0, 8),  # nothing to play
])
def test_a_short_pool_plays_each_environment_enough_to_fill_the_batch(n_envs, plays):
    assert plays_to_fill(n_envs, 8, 192) == plays


def test_no_batch_limit_keeps_the_configured_plays():
    assert plays_to_fill(3, 8, 0) == 8


@pytest.mark.parametrize("n, target, indices", [
    (3, 7, [0, 1, 2, 0, 1, 2, 0]),  # reference upsample_trajectories: round-robin copies
    (3, 3, [0, 1, 2]),
    (5, 2, [0, 1, 2, 3, 4]),  # never trims: that is order_for_training's job
    (0, 4, []),  # nothing to copy
])
def test_fill_indices_repeat_the_samples_round_robin(n, target, indices):
    assert fill_indices(n, target) == indices


def test_assemble_pads_masks_and_broadcasts_advantage():
    batch = assemble_batch([sample("designer", 5, 2, adv=2.0, weight=0.5),
                            sample("agent", 3, 1, adv=-1.0)], pad_id=0, rows_multiple=4)
    assert batch["tokens"].shape == (4, 64)
    assert batch["tokens"][0, :5].tolist() == [1, 2, 3, 4, 5]
    assert batch["mask"][0].sum() == 5 and batch["mask"][2:].sum() == 0
    assert batch["loss_mask"][0].tolist()[:6] == [False, False, False, True, True, False]
    assert batch["advantages"][0, 3] == pytest.approx(1.0)  # advantage * weight
    assert batch["advantages"][0, :3].sum() == 0  # only generated tokens carry advantage
    logp = batch["behaviour_logp"]
    assert logp[0, 0] == 0.0 and logp[0, 4] == pytest.approx(-0.5)
    assert batch["is_designer"].tolist() == [True, False, False, False]


def test_bucket_length_and_truncation():
    assert [bucket_length(n) for n in (1, 64, 65, 300)] == [64, 64, 128, 512]
    batch = assemble_batch([sample("agent", 300, 10)], pad_id=0, max_len=128)
    assert batch["tokens"].shape == (1, 128)


def test_length_groups_pad_each_group_to_its_own_bucket():
    samples = [sample("agent", n, 1) for n in (30, 70, 3000, 100, 65, 90, 60)]
    groups = length_groups(samples)  # buckets 4096 | 128 | 64, longest first, order kept
    assert [[len(s.tokens) for s in g] for g in groups] == [[3000], [70, 100, 65, 90], [30, 60]]
    capped = length_groups(samples, max_len=128)  # 4096 is cut to 128 and joins that group
    assert [[len(s.tokens) for s in g] for g in capped] == [[70, 3000, 100, 65, 90], [30, 60]]


def test_mismatched_lengths_rejected():
    with pytest.raises(ValueError, match="same length"):
        TrainSample(np.zeros(3, np.int32), np.zeros(2, bool), np.zeros(3, np.float32), 0.0, "agent")
    with pytest.raises(ValueError, match="role"):
        TrainSample(np.zeros(1, np.int32), np.zeros(1, bool), np.zeros(1, np.float32), 0.0, "x")


def test_delayed_designer_samples_survive_a_checkpoint_round_trip():
    original = sample("designer", 7, 3, adv=0.25, weight=2.0)
    copy = TrainSample.from_json(json.loads(json.dumps(original.to_json())))
    assert copy.tokens.tolist() == original.tokens.tolist()
    assert copy.loss_mask.tolist() == original.loss_mask.tolist()
    assert copy.behaviour_logp.tolist() == original.behaviour_logp.tolist()
    assert (copy.advantage, copy.role, copy.weight) == (0.25, "designer", 2.0)


def test_zero_advantage_samples_are_dropped_and_their_generated_tokens_counted():
    samples = [sample("agent", 10, 4, adv=0.0), sample("agent", 12, 5, adv=0.5),
               sample("designer", 20, 8, adv=1.0, weight=0.0)]
    kept, skipped_tokens, skipped_samples = drop_zero_advantage(samples)
    assert kept == [samples[1]] and (skipped_tokens, skipped_samples) == (4 + 8, 2)
    # designer row cut at 17 keeps 5 generated tokens; at 12 it keeps none and is no sample
    assert drop_zero_advantage(samples, max_len=17)[1:] == (4 + 5, 2)
    assert drop_zero_advantage(samples, max_len=12)[1:] == (4, 1)
    # all zero: the shortest sample stays so the step has a batch
    kept, skipped_tokens, skipped_samples = drop_zero_advantage([samples[2], samples[0]])
    assert kept == [samples[0]] and (skipped_tokens, skipped_samples) == (8, 1)


def test_checkpoints_from_before_the_rename_still_load():
    data = sample("designer", 7, 3).to_json()
    data["old_logp"] = data.pop("behaviour_logp")
    assert TrainSample.from_json(data).behaviour_logp.tolist()[-1] == -0.5
