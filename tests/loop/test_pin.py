"""A tiny fixed-seed run writes exactly the metrics and environments of tests/loop/pin_golden.json.

Regenerate the golden after an intended behaviour change: `python -m tests.loop.pin --write`.
"""

import json

import pytest

from tests.loop import pin


@pytest.mark.slow
def test_a_tiny_fixed_seed_run_matches_its_golden(tmp_path):
    golden = json.loads(pin.GOLDEN.read_text())
    observed = pin.run_pinned(tmp_path)
    found = pin.differences(observed, golden)
    assert not found, ("the run differs from tests/loop/pin_golden.json (if intended, run "
                       "`python -m tests.loop.pin --write`):\n" + "\n".join(found[:40]))


def test_differences_names_a_changed_metric_and_file():
    golden = {"metrics": [{"cycle": 0, "return/nohint": 0.5}], "envs": {"a.py": "x"}}
    observed = {"metrics": [{"cycle": 0, "return/nohint": 0.25}], "envs": {"a.py": "y",
                                                                         "b.py": "z"}}
    assert pin.differences(observed, golden) == [
        "cycle 0 return/nohint: 0.25, golden 0.5", "envs file a.py differs",
        "envs file b.py only in the run"]
    assert pin.differences(golden, golden) == []
