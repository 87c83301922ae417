"""Names pre-injected into an environment's namespace, as the reference loader does.

Designer code often uses `random`, `deque`, `Counter`... without importing them; the reference
(`spade/core/envs/synthetic_game_env.py`) injects these names before `exec`, so we do too.
Stdlib only: this module runs inside the sandbox worker.
"""

import importlib

INJECTED_MODULES = (
    "random", "re", "math", "json", "collections", "itertools", "functools", "string",
    "heapq", "copy", "operator", "statistics", "typing",
)
INJECTED_FROM = {
    "collections": ("deque", "defaultdict", "Counter", "OrderedDict", "namedtuple"),
    "itertools": ("combinations", "permutations", "product", "accumulate", "chain"),
    "functools": ("reduce", "lru_cache", "partial"),
    "copy": ("deepcopy",),
    "heapq": ("heappush", "heappop", "heapify"),
    "typing": (
        "Any", "Callable", "Dict", "List", "Optional", "Set", "Tuple", "Union", "Iterable",
        "Sequence", "Mapping",
    ),
}


def build_namespace(module_name: str = "designer_env") -> dict:
    """A fresh module namespace with the injected stdlib names (and numpy as np, if present)."""
    namespace: dict = {"__name__": module_name, "__builtins__": __builtins__}
    for name in INJECTED_MODULES:
        module = importlib.import_module(name)
        namespace[name] = module
        for attr in INJECTED_FROM.get(name, ()):
            namespace[attr] = getattr(module, attr)
    try:
        import numpy
    except ImportError:
        pass
    else:
        namespace["np"] = namespace["numpy"] = numpy
    return namespace
