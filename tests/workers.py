"""How the suite is split over pytest-xdist workers (pyproject.toml's addopts: `-n auto
--dist loadfile`): a file is a unit of work, except that the files sharing an expensive session
fixture of a tests/ conftest (a training run, a compiled Runtime, the sandbox pool) form one
unit, so one worker builds the fixture once. tests/test_workers.py checks the table against
the fixtures the files use.
"""

from xdist.scheduler import LoadFileScheduling

SHARED_FIXTURE_UNITS = {
    "learning_runtime_session": ("tests/learning/test_agent_learns.py",
                                 "tests/learning/test_designer_learns.py"),
    "tiny_runtime": ("tests/loop/test_cycle.py", "tests/loop/test_sampling_roles.py",
                     "tests/loop/test_self_validation.py"),
    "tiny_workdir": ("tests/scaleout/test_checkpoint_topology.py",
                     "tests/scaleout/test_export.py"),
    "pool": ("tests/envs/test_attacks.py", "tests/envs/test_contract.py",
             "tests/envs/test_pool.py", "tests/envs/test_tool_use.py",
             "tests/envs/test_validate.py"),
}
UNIT_OF_FILE = {path: unit for unit, paths in SHARED_FIXTURE_UNITS.items() for path in paths}


def file_of(nodeid: str) -> str:
    """The file part of a test id."""
    return nodeid.split("::")[0]


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its shared-fixture unit, else its file."""
    return UNIT_OF_FILE.get(file_of(nodeid), file_of(nodeid))


class SharedFixtureScheduling(LoadFileScheduling):
    """xdist's per-file scheduling with the shared-fixture units above."""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)


def shared_fixture_files(items) -> dict[str, set[str]]:
    """Session fixture of a tests/ conftest -> the test files among `items` that use it."""
    users: dict[str, set[str]] = {}
    for item in items:
        for name, definitions in item._fixtureinfo.name2fixturedefs.items():
            definition = definitions[-1]
            if definition.scope == "session" and definition.baseid:  # ours, not a plugin's
                users.setdefault(name, set()).add(file_of(item.nodeid))
    return users


def pytest_collection_finish(session):
    """Loaded as a plugin (`-p tests.workers`) by tests/test_workers.py: writes the
    shared-fixture users of the whole collection to the JSON file named in $USERS_FILE."""
    import json
    import os

    if os.environ.get("USERS_FILE"):
        users = shared_fixture_files(session.items)
        with open(os.environ["USERS_FILE"], "w") as handle:
            json.dump({name: sorted(files) for name, files in users.items()}, handle)
