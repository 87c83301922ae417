"""Multi-host start-up follows JAX's own cluster detection, environment by environment.

The real `jax._src.clusters` classes are run against faked environments (env vars; the TPU VM
flag and metadata server patched), so the test checks what JAX itself would detect there.
"""

import pytest
from jax._src.clusters import cloud_tpu_cluster

from spade_jax import distributed
from spade_jax.distributed import DetectedCluster, decide_startup, detect_cluster

CLUSTER_VARS = [
    "SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
    "OMPI_MCA_orte_hnp_uri", "PMIX_SERVER_URI", "KUBERNETES_SERVICE_HOST",
    "TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES", "TPU_WORKER_ID", "TPU_SKIP_MDS_QUERY",
    "MEGASCALE_NUM_SLICES", "MEGASCALE_SLICE_ID", "MEGASCALE_COORDINATOR_ADDRESS",
    "SPADE_COORDINATOR",
]


@pytest.fixture
def bare_env(monkeypatch):
    """No cluster variables and not a Cloud TPU VM: a laptop or a plain server."""
    for name in CLUSTER_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(cloud_tpu_cluster, "running_in_cloud_tpu_vm", False)
    return monkeypatch


def tpu_vm_metadata(monkeypatch, worker: int, endpoints: list[str], tpu_env: str = ""):
    """A Cloud TPU VM whose metadata server reports this worker number, slice endpoints and
    `tpu-env` (where multislice runs name MEGASCALE_NUM_SLICES)."""
    values = {"agent-worker-number": str(worker), "tpu-env": tpu_env,
              "worker-network-endpoints": ",".join(f"w{i}:x:{ip}" for i, ip in
                                                   enumerate(endpoints))}
    monkeypatch.setattr(cloud_tpu_cluster, "running_in_cloud_tpu_vm", True)
    monkeypatch.setattr(cloud_tpu_cluster, "get_metadata",
                        lambda key: (values[key], 200) if key in values else ("", 404))


def test_plain_machine_detects_nothing_and_starts_alone(bare_env):
    assert detect_cluster() is None
    assert decide_startup(None, None).action == "single"


def test_queued_resource_tpu_vm_slice_is_detected_through_the_metadata_server(bare_env):
    tpu_vm_metadata(bare_env, worker=3, endpoints=[f"10.0.0.{i}" for i in range(8)])
    detected = detect_cluster()
    assert detected == DetectedCluster("GceTpuCluster", 8, "gcetpu")
    decision = decide_startup(None, detected)
    assert decision.action == "auto" and "GceTpuCluster" in decision.reason


def test_multislice_tpu_vms_count_every_slice(bare_env):
    tpu_vm_metadata(bare_env, worker=0, endpoints=["10.0.0.1", "10.0.0.2"],
                    tpu_env="MEGASCALE_NUM_SLICES: '2'\nMEGASCALE_SLICE_ID: '1'")
    assert detect_cluster() == DetectedCluster("GceTpuCluster", 4, "gcetpu")


def test_single_host_tpu_vm_is_detected_but_not_initialised(bare_env):
    tpu_vm_metadata(bare_env, worker=0, endpoints=["10.0.0.1"])
    detected = detect_cluster()
    assert detected == DetectedCluster("GceTpuCluster", 1, "gcetpu")
    assert decide_startup(None, detected).action == "single"


def test_gke_tpu_slice_is_detected_from_its_worker_hostnames(bare_env):
    tpu_vm_metadata(bare_env, worker=1, endpoints=[])  # only `tpu-env` is read
    bare_env.setenv("TPU_SKIP_MDS_QUERY", "true")
    bare_env.setenv("TPU_WORKER_HOSTNAMES", "h0,h1,h2,h3")
    bare_env.setenv("TPU_WORKER_ID", "1")
    detected = detect_cluster()
    assert detected == DetectedCluster("GkeTpuCluster", 4, "gketpu")
    assert decide_startup(None, detected).action == "auto"


@pytest.mark.parametrize("ntasks, action", [(4, "auto"), (1, "single")])
def test_slurm_job_is_detected_with_its_task_count(bare_env, ntasks, action):
    for name, value in {"SLURM_JOB_ID": "77", "SLURM_STEP_NODELIST": "node[1-4]",
                        "SLURM_PROCID": "0", "SLURM_NTASKS": str(ntasks),
                        "SLURM_LOCALID": "0"}.items():
        bare_env.setenv(name, value)
    detected = detect_cluster()
    assert detected == DetectedCluster("SlurmCluster", ntasks, "slurm")
    assert decide_startup(None, detected).action == action


def test_explicit_coordinator_wins_over_detection():
    decision = decide_startup("localhost:1234", DetectedCluster("SlurmCluster", 4, "slurm"))
    assert decision.action == "explicit" and "localhost:1234" in decision.reason


class FakeCluster:
    """A stand-in `ClusterEnv` subclass: present or not, with a process count or an error."""

    opt_in_only_method = False
    name = "fake"

    def __init__(self, present, count=2, error=None, opt_in=False):
        self.present, self.count, self.error = present, count, error
        self.opt_in_only_method = opt_in
        self.__name__ = f"Fake{count}"

    def is_env_present(self):
        return self.present

    def get_process_count(self):
        if self.error:
            raise self.error
        return self.count


def test_first_present_non_opt_in_cluster_is_picked_in_jax_order():
    order = [FakeCluster(False, 9), FakeCluster(True, 7, opt_in=True), FakeCluster(True, 3),
             FakeCluster(True, 5)]
    assert detect_cluster(order) == DetectedCluster("Fake3", 3, "fake")


def test_unreadable_process_count_is_a_clear_error():
    with pytest.raises(RuntimeError, match="Fake2.*could not read its process count.*timeout"):
        detect_cluster([FakeCluster(True, 2, error=TimeoutError("metadata timeout"))])


def test_initialize_joins_a_detected_cluster_the_way_jax_detects_it(bare_env, caplog):
    calls = []
    bare_env.setattr(distributed, "_initialized", False)
    bare_env.setattr(distributed.jax.distributed, "initialize",
                     lambda *args, **kwargs: calls.append((args, kwargs)))
    bare_env.setattr(distributed, "detect_cluster",
                     lambda: DetectedCluster("GceTpuCluster", 8, "gcetpu"))
    with caplog.at_level("INFO"):
        distributed.initialize_from_environment()
    assert calls == [((), {"cluster_detection_method": "gcetpu"})]
    assert "cluster 'GceTpuCluster' detected with 8 processes" in caplog.text


def test_initialize_on_a_single_process_does_nothing(bare_env, caplog):
    bare_env.setattr(distributed, "_initialized", False)
    bare_env.setattr(distributed.jax.distributed, "initialize",
                     lambda *args, **kwargs: pytest.fail("initialize called"))
    with caplog.at_level("INFO"):
        distributed.initialize_from_environment()
    assert "no cluster environment detected" in caplog.text
    assert distributed._initialized is False
