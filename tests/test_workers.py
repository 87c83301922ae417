"""The xdist units of tests/workers.py against the session fixtures that the files of the whole
suite (collected in a child pytest) use."""

import json
import os
import subprocess
import sys

import pytest

from tests.commands import ROOT
from tests.workers import SHARED_FIXTURE_UNITS, unit_of


@pytest.fixture(scope="module")
def fixture_users(tmp_path_factory) -> dict[str, list[str]]:
    """Session fixture of a tests/ conftest -> the test files that use it."""
    path = tmp_path_factory.mktemp("collection") / "users.json"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "tests.workers"],
        cwd=ROOT, env={**os.environ, "USERS_FILE": str(path)}, capture_output=True, text=True,
        timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(path.read_text())


def test_files_that_share_a_session_fixture_are_one_unit_of_work(fixture_users):
    shared = {name: files for name, files in fixture_users.items() if len(files) > 1}
    assert shared, fixture_users
    for name, files in shared.items():
        units = {unit_of(path) for path in files}
        assert len(units) == 1 and units <= SHARED_FIXTURE_UNITS.keys(), (name, files, units)


def test_each_unit_lists_the_files_that_use_its_fixture(fixture_users):
    for name, paths in SHARED_FIXTURE_UNITS.items():
        assert sorted(paths) == fixture_users.get(name), name
