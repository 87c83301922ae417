"""The validation gate divided among hosts: each candidate validated once, every host gets all.

Two "processes" are threads with their own sandbox pools (`tests.exchange`); the reports they
end with must be what one process validating everything finds, and each pool must only ever
have validated its own candidates (i % 2 == rank).
"""

from spade_jax.distributed import map_over_processes
from spade_jax.envs import EnvPool, ValidationReport, validate
from tests.envs.conftest import TEST_CONFIG, case
from tests.exchange import run_as_processes

TEXTS = [f"```python\n{case('good_guess')}\n```", "```python\ndef broken(:\n```",
         "no code here", "```python\nclass AEnv:\n    pass\n```"]


def outcome(report: ValidationReport):
    return report.ok, report.failures, report.code, report.env_class


def test_each_candidate_is_validated_by_one_host_and_every_host_gets_every_report():
    with EnvPool(TEST_CONFIG, warm=2, max_turns=10) as pool:
        want = [outcome(validate(t, max_turns=10, pool=pool)) for t in TEXTS]
    assert [w[0] for w in want] == [True, False, False, False]
    assert [w[1][0][0] for w in want[1:]] == ["V1", "V0", "V3"]

    pools = [EnvPool(TEST_CONFIG, warm=2, max_turns=10) for _ in range(2)]
    validated: list[list[str]] = [[], []]

    def host(rank, gather):
        def validate_here(text):
            validated[rank].append(text)
            return validate(text, max_turns=10, pool=pools[rank])
        return map_over_processes(validate_here, TEXTS, encode=ValidationReport.to_json,
                                  decode=ValidationReport.from_json, process_index=rank,
                                  process_count=2, gather=gather)

    try:
        reports = run_as_processes(2, host)
    finally:
        for p in pools:
            p.shutdown()
    assert validated == [TEXTS[0::2], TEXTS[1::2]]
    assert reports[0] == reports[1]  # timings too: each report comes from its one validator
    assert [outcome(r) for r in reports[0]] == want
    assert all(isinstance(f, tuple) for r in reports[0] for f in r.failures)


def test_one_process_is_a_plain_map():
    calls = []
    out = map_over_processes(lambda x: calls.append(x) or x * 2, [1, 2, 3], encode=str,
                             decode=int, process_index=0, process_count=1)
    assert out == [2, 4, 6] and calls == [1, 2, 3]
