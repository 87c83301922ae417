"""AST lint of designer code (validation V1): a quality filter, not the security boundary.

Rejects imports outside an allow-list, calls of builtins that reach the outside world or the
interpreter (open, exec, eval, compile, __import__, input, globals, ...) and the attribute
names used by dunder escapes (`().__class__.__base__.__subclasses__()`, `f.__globals__`, ...).
"""

import ast
import threading

ALLOWED_IMPORTS = frozenset({
    "__future__", "abc", "array", "bisect", "cmath", "collections", "copy", "dataclasses",
    "datetime", "decimal", "difflib", "enum", "fractions", "functools", "hashlib", "heapq",
    "itertools", "json", "math", "numbers", "numpy", "operator", "random", "re", "statistics",
    "string", "textwrap", "typing", "unicodedata", "spade_jax",
})
BANNED_CALLS = frozenset({
    "open", "exec", "eval", "compile", "__import__", "input", "globals", "locals", "vars",
    "breakpoint", "memoryview", "help", "exit", "quit",
})
BANNED_ATTRIBUTES = frozenset({
    "__subclasses__", "__globals__", "__builtins__", "__bases__", "__base__", "__mro__",
    "__code__", "__closure__", "__func__", "__getattribute__", "__reduce__", "__reduce_ex__",
    "__loader__", "__spec__", "__import__", "__dict__", "__traceback__", "__frame__",
    "tb_frame", "f_globals", "f_locals", "f_back", "f_builtins", "gi_frame", "gi_code",
    "cr_frame", "co_code", "ag_frame",
})
BANNED_NAMES = frozenset({"__builtins__", "__loader__", "__spec__", "__import__"})

# CPython 3.11 keeps ast.parse's recursion counter in interpreter-wide state: two threads
# building ASTs at once can corrupt it, and a parse fails with "SystemError: AST constructor
# recursion depth mismatch" (python/cpython#106905). Every parse of ours goes through one lock,
# re-entrant because a finalizer that runs mid-parse may parse too.
_PARSE_LOCK = threading.RLock()


def parse_source(code: str, mode: str = "exec") -> ast.AST:
    """`ast.parse`, safe to call from several threads at once (see _PARSE_LOCK)."""
    with _PARSE_LOCK:
        return ast.parse(code, mode=mode)


def lint(tree: ast.AST) -> list[str]:
    """Human-readable problems found in a parsed module; empty when it passes."""
    problems = []
    for node in ast.walk(tree):
        where = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] not in ALLOWED_IMPORTS:
                    problems.append(f"{where}: import of {alias.name!r} is not allowed")
        elif isinstance(node, ast.ImportFrom):
            module = (node.module or "").split(".")[0]
            if node.level or module not in ALLOWED_IMPORTS:
                problems.append(f"{where}: import from {node.module!r} is not allowed")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in BANNED_CALLS:
                problems.append(f"{where}: call of {node.func.id}() is not allowed")
            elif node.func.id in {"getattr", "setattr", "delattr", "hasattr"} and any(
                isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                and arg.value.startswith("__") for arg in node.args[1:2]
            ):
                problems.append(f"{where}: {node.func.id}() of a dunder attribute is not allowed")
        elif isinstance(node, ast.Attribute) and node.attr in BANNED_ATTRIBUTES:
            problems.append(f"{where}: attribute {node.attr!r} is not allowed")
        elif isinstance(node, ast.Name) and node.id in BANNED_NAMES:
            problems.append(f"{where}: name {node.id!r} is not allowed")
    return problems
