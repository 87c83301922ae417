"""notebooks/colab_quickstart.ipynb: built from its script, and runs top to bottom on CPU."""

import importlib.util
import os

import pytest

from tests.commands import one_device_xla_flags
from tests.scaleout.conftest import ROOT

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
NOTEBOOKS = ROOT / "notebooks"


def load_builder():
    spec = importlib.util.spec_from_file_location("build_quickstart",
                                                  NOTEBOOKS / "build_quickstart.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_notebook_is_built_from_its_script():
    built = load_builder().build()
    saved = nbformat.read(NOTEBOOKS / "colab_quickstart.ipynb", as_version=4)
    assert [c.source for c in saved.cells] == [c.source for c in built.cells], (
        "notebooks/colab_quickstart.ipynb is stale: run python notebooks/build_quickstart.py")
    model_lines = [line for c in saved.cells for line in c.source.splitlines()
                   if line.startswith("MODEL = ")]
    assert model_lines == ['MODEL = "tiny"  # or "smollm2_135m" on Colab TPU/GPU']


@pytest.mark.slow
def test_notebook_runs_top_to_bottom_on_the_tiny_config(monkeypatch):
    # One CPU device in the kernel: the notebook's path on a laptop or a Colab CPU runtime.
    monkeypatch.setenv("XLA_FLAGS", one_device_xla_flags())
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    notebook = nbformat.read(NOTEBOOKS / "colab_quickstart.ipynb", as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=1800, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()
    outputs = "\n".join(
        o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.outputs)
    for expected in ("parameters on mesh", "valid:", "regret", "mean return", "results in"):
        assert expected in outputs, expected
    images = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs
              if "image/png" in o.get("data", {})]
    assert images, "the regret/return plot did not render"
