"""Agent plays with environments stepped in the background: a slow environment holds only its
own episode, and what every episode plays does not depend on when its steps came back."""

import math

import pytest

from spade_jax.envs import EnvPool
from spade_jax.spade.envrunner import SandboxEnvRunner
from spade_jax.spade.rollout import ChatFormat, Decoding, EpisodeSpec, play_episodes
from tests.envs.conftest import TEST_CONFIG, case
from tests.loop.pin import ScriptedSession


@pytest.fixture(scope="module")
def smollm2():
    from spade_jax.weights.gguf import smollm2_gguf_path
    from spade_jax.weights.tokenizer import load_tokenizer

    return load_tokenizer(smollm2_gguf_path())


class CountingSampler:
    """Answers every turn with the next number after the ones in its prompt (a turn completes
    in one decode segment)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def start(self, prompts, *, capacity):
        return ScriptedSession(self.tokenizer, lambda text, row, seed: f"number {seed}",
                               prompts, capacity)


class RecordingRunner(SandboxEnvRunner):
    """A sandbox runner that records which episodes (by spec index) each submission stepped."""

    def __init__(self, pool):
        super().__init__(pool, max_turns=5)
        self.index, self.submitted = {}, []

    def reset_many(self, specs):
        starts = super().reset_many(specs)
        self.index = {s.handle: i for i, s in enumerate(starts)}
        return starts

    def submit_steps(self, handles_and_actions):
        pairs = list(handles_and_actions)
        self.submitted.append(sorted(self.index[h] for h, _ in pairs))
        self.actions = [a for _, a in pairs]
        super().submit_steps(pairs)


def test_the_environment_steps_with_the_action_made_of_each_reply(smollm2):
    """SPADE's game plays pass `GameType.GAME.agent_action`: the boxed action alone, as the
    reference's parse_action; without it the environment gets the reply as decoded."""
    from spade_jax.spade.prompts import GameType

    class BoxingSampler(CountingSampler):
        def start(self, prompts, *, capacity):
            return ScriptedSession(self.tokenizer, lambda text, row, seed:
                                   f"Maybe \\boxed{{ {seed} }}, or \\boxed{{9}}.",
                                   prompts, capacity)

    actions = {}
    for name, to_action in (("game", GameType.GAME.agent_action), ("raw", str)):
        with EnvPool(TEST_CONFIG, warm=1, max_turns=5) as pool:
            runner = RecordingRunner(pool)
            play_episodes(
                [EpisodeSpec("count", case("slow_counter"), 0)], sampler=BoxingSampler(smollm2),
                envs=runner, chat=ChatFormat(smollm2), system_prompt="SYS", max_turns=1,
                decoding=Decoding(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=16),
                seed=0, capacity=1024, to_action=to_action)
        actions[name] = runner.actions
    assert actions == {"game": ["\\boxed{0}"], "raw": ["Maybe \\boxed{ 0 }, or \\boxed{9}."]}


def play(tokenizer, step_wait_s):
    """Three episodes of slow_counter; seed 1's steps take a second, the others' none."""
    specs = [EpisodeSpec("count", case("slow_counter"), seed) for seed in (0, 1, 2)]
    with EnvPool(TEST_CONFIG, warm=3, max_turns=5) as pool:
        runner = RecordingRunner(pool)
        episodes = play_episodes(
            specs, sampler=CountingSampler(tokenizer), envs=runner,
            chat=ChatFormat(tokenizer), system_prompt="SYS", max_turns=5,
            decoding=Decoding(temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=16), seed=0,
            capacity=1024, step_wait_s=step_wait_s)
    return episodes, runner.submitted


def test_a_slow_environment_holds_only_its_own_episode(smollm2):
    background, submitted = play(smollm2, step_wait_s=0.2)
    # the fast episodes play their three turns while the slow one's first step runs
    assert submitted == [[0, 1, 2], [0, 2], [0, 2], [1], [1]], submitted
    lockstep, in_lockstep = play(smollm2, step_wait_s=math.inf)
    assert in_lockstep == [[0, 1, 2]] * 3
    for a, b in zip(background, lockstep, strict=True):
        assert a.tokens.tolist() == b.tokens.tolist()
        assert (a.rewards, a.turns, a.status, a.terminated) == (
            b.rewards, b.turns, b.status, b.terminated) == ([0.0, 0.0, 1.0], 3, "ok", True)


FRAGILE_ENV = '''
class FragileEnv:
    """Raises at its second step when the seed is 0; counts to three otherwise."""

    def __init__(self, max_turns=25, **kwargs):
        self.max_turns = max_turns

    def reset(self, seed=None):
        self.turn, self.fragile = 0, seed == 0
        return "Count to three.", {}

    def step(self, action):
        self.turn += 1
        if self.fragile and self.turn == 2:
            raise RuntimeError("the game's own bug")
        return "say the next number.", float(self.turn >= 3), self.turn >= 3, False, {}
'''


def play_fragile(tokenizer, step_error_reward, answer="seven", max_new_tokens=16, cut=False):
    """Seeds 0 (its second step raises) and 1 of FragileEnv, every reply `answer`."""

    class Answering(CountingSampler):
        def start(self, prompts, *, capacity):
            return ScriptedSession(self.tokenizer, lambda text, row, seed: answer,
                                   prompts, capacity)

    specs = [EpisodeSpec("fragile", FRAGILE_ENV, seed, end_on_cut_reply=cut) for seed in (0, 1)]
    with EnvPool(TEST_CONFIG, warm=2, max_turns=5) as pool:
        runner = RecordingRunner(pool)
        episodes = play_episodes(
            specs, sampler=Answering(tokenizer), envs=runner, chat=ChatFormat(tokenizer),
            system_prompt="SYS", max_turns=5, seed=0, capacity=1024,
            decoding=Decoding(temperature=1.0, top_p=1.0, top_k=0,
                              max_new_tokens=max_new_tokens),
            step_error_reward=step_error_reward)
    return episodes, runner.submitted


@pytest.mark.parametrize("step_error_reward", [-1.0, None])
def test_a_step_that_raises_ends_the_play_as_a_loss_or_fails_it(smollm2, step_error_reward):
    """The reference's environment wrapper answers a step that raises with ("Error: ...",
    -1.0, terminated): a loss, trained like any play. Without it the play fails."""
    (fragile, sound), _ = play_fragile(smollm2, step_error_reward)
    assert (sound.rewards, sound.terminated, sound.status) == ([0.0, 0.0, 1.0], True, "ok")
    assert fragile.turns == 2
    if step_error_reward is None:
        assert (fragile.rewards, fragile.status, fragile.failed) == ([0.0], "crashed", True)
    else:
        assert (fragile.rewards, fragile.terminated, fragile.status) == (
            [0.0, -1.0], True, "env_error")
        assert not fragile.failed and fragile.episode_return == -1.0


def test_a_reply_cut_by_its_token_budget_ends_the_play_unstepped_when_asked(smollm2):
    """The reference's no-hint plays: a reply without an end-of-turn token (it used its whole
    budget) ends the episode truncated, its environment not stepped; otherwise it is stepped."""
    long_answer = "one two three four five six seven eight nine ten"
    for cut in (True, False):
        episodes, submitted = play_fragile(smollm2, -1.0, answer=long_answer,
                                           max_new_tokens=4, cut=cut)
        if cut:
            assert submitted == []
            assert all((e.turns, e.rewards, e.terminated, e.status, e.episode_return)
                       == (1, [], False, "ok", 0.0) for e in episodes)
        else:
            assert submitted[0] == [0, 1] and episodes[1].rewards == [0.0, 0.0, 1.0]
    short, submitted = play_fragile(smollm2, -1.0, cut=True)  # ends on EOS: stepped
    assert submitted[0] == [0, 1] and short[1].rewards == [0.0, 0.0, 1.0]
