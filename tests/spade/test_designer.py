import dataclasses

from spade_jax.spade.designer import design_environments


@dataclasses.dataclass
class FakeCompletion:
    text: str
    tokens: tuple = ()
    logprobs: tuple = ()


@dataclasses.dataclass
class FakeReport:
    ok: bool
    code: str | None


def test_invalid_designs_are_retried_with_fresh_prompts_and_all_attempts_kept():
    prompts_seen = []

    def build_prompt(slot, skill, attempt):
        prompts_seen.append((slot, attempt))
        return [{"role": "user", "content": f"{skill}-{attempt}"}], f"doc{slot}-{attempt}"

    def generate(messages_list):
        return [FakeCompletion(m[0]["content"]) for m in messages_list]

    # slot 0 valid at once; slot 1 valid on the second attempt; slot 2 never valid
    def validate(text):
        ok = text.startswith("A-") or text == "B-1"
        return FakeReport(ok, "class XEnv: pass" if ok else None)

    attempts, admitted = design_environments(
        ["A", "B", "C"], cycle=7, build_prompt=build_prompt, generate=generate,
        validate_many=lambda texts: [validate(t) for t in texts], max_attempts=3)
    assert prompts_seen == [(0, 0), (1, 0), (2, 0), (1, 1), (2, 1), (2, 2)]
    assert len(attempts) == 6 and sum(a.valid for a in attempts) == 2
    assert [(e.skill, e.doc_id) for e in admitted] == [("A", "doc0-0"), ("B", "doc1-1")]
    assert admitted[0].env_id == "c00007_s000_a"
