"""Every sampling knob of every role (Designer, hint, Agent, self-validation) reaches
`Session.begin_turn` (where `Session.decode` and the `Engine` start their turns)."""

from spade_jax.config import load_config_file
from spade_jax.spade.driver import run_training
from spade_jax.spade.prompts import GAME_HINT_SYSTEM_PROMPT
from spade_jax.spade.self_validation import GAME_SELF_VALIDATION_SYSTEM_PROMPT
from tests.loop import pin

KNOBS = ("temperature", "top_p", "top_k")
SETTINGS = {  # distinct values per role, none of them a default
    "designer": dict(temperature=0.51, top_p=0.91, top_k=7, max_new_tokens=4096),
    "hint": dict(temperature=0.52, top_p=0.82, top_k=5, max_new_tokens=24),
    "agent": dict(temperature=0.53, top_p=0.73, top_k=3, max_new_tokens=12),
    "validator": dict(temperature=0.54, top_p=0.64, top_k=4, max_new_tokens=16),
}
VALIDATOR_MARKER = GAME_SELF_VALIDATION_SYSTEM_PROMPT[:60]


class RecordingSampler(pin.ScriptedSampler):
    """The pin's scripted sampler, noting each decode call's role and settings."""

    def __init__(self, tokenizer, seed_envs):
        super().__init__(tokenizer, pin.short_seed_codes(seed_envs))
        self.calls = []

    def answer(self, prompt: str, row: int, seed: int) -> str:
        """Scripted answers, and a verdict that keeps every design for the self-validation."""
        return "\\boxed{yes}" if VALIDATOR_MARKER in prompt else super().answer(prompt, row, seed)

    def start(self, prompts, *, capacity):
        session = super().start(prompts, capacity=capacity)
        first = session.prompt_texts[0]
        role = ("designer" if pin.DESIGNER_MARKER in first
                else "hint" if GAME_HINT_SYSTEM_PROMPT.strip()[:60] in first
                else "validator" if VALIDATOR_MARKER in first else "agent")
        begin_turn = session.begin_turn

        def recording_begin_turn(limits, **kwargs):
            self.calls.append((role, max(limits), {k: kwargs[k] for k in KNOBS}))
            return begin_turn(limits, **kwargs)

        session.begin_turn = recording_begin_turn
        return session


def test_each_roles_sampling_settings_reach_the_sampler(tmp_path, tiny_runtime, monkeypatch):
    cfg = load_config_file("tiny")
    cfg.total_cycles = 1
    cfg.spade.replay_per_cycle = 0
    cfg.spade.hint_mode = "self"  # the policy writes the hints: a third kind of generation
    cfg.spade.self_validation = True  # and judges the designs: a fourth
    for role, values in SETTINGS.items():
        for key, value in values.items():
            cfg.sampling[f"{role}_{key}"] = value
    sampler = RecordingSampler(tiny_runtime.tokenizer, tiny_runtime.seed_envs)
    monkeypatch.setattr(tiny_runtime, "sampler", sampler)
    try:
        run_training(cfg, str(tmp_path), runtime=tiny_runtime)
    finally:  # the shared runtime's own sampler back, on the weights this run trained
        monkeypatch.undo()
        tiny_runtime.set_device_state(tiny_runtime.train_state)
    assert {role for role, _, _ in sampler.calls} == set(SETTINGS)
    for role, max_new_tokens, knobs in sampler.calls:
        want = SETTINGS[role]
        assert knobs == {k: want[k] for k in KNOBS}, role
        assert max_new_tokens == want["max_new_tokens"], role
