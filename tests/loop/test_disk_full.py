"""A checkpoint save that hits a full disk: a clear error, and the previous checkpoint survives.

The disk is real: a 6 MB tmpfs from bubblewrap (the sandbox's own dependency), two checkpoints
of 4 MB of incompressible floats, so the second cannot fit.
"""

import shutil
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import sys
    import jax.numpy as jnp
    import numpy as np
    from spade_jax.checkpoint import Checkpointer
    from spade_jax.errors import CheckpointError

    state = {"w": jnp.asarray(np.random.default_rng(0).random(1_000_000, dtype=np.float32))}
    ck = Checkpointer(sys.argv[1], keep=3)
    ck.save(1, state, {"cycle": 1})
    try:
        ck.save(2, {"w": state["w"] + 1}, {"cycle": 2})
        print("SAVED")
    except CheckpointError as err:
        print("CHECKPOINT_ERROR", err)
    step = ck.latest_step()
    restored, host = ck.restore(step, state)
    print("LATEST", step, host["cycle"], bool((restored["w"] == state["w"]).all()))
""")


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap for the small tmpfs")
def test_full_disk_raises_checkpoint_error_and_keeps_the_previous_checkpoint(tmp_path):
    script = tmp_path / "save_twice.py"
    script.write_text(SCRIPT)
    proc = subprocess.run(
        ["bwrap", "--dev-bind", "/", "/", "--size", str(6 * 10**6), "--tmpfs", "/mnt",
         "--", sys.executable, str(script), "/mnt/run"],
        capture_output=True, text=True, timeout=300)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SAVED" not in out
    assert "CHECKPOINT_ERROR could not write checkpoint 2" in out
    assert "No space left on device" in out and "The previous checkpoint (step 1) is intact" in out
    assert "LATEST 1 1 True" in out
