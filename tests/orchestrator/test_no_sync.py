"""The orchestrator adds no GPU synchronisation per iteration: no module of it calls a
host-blocking CUDA API, and a CUDA event is only read (``elapsed_time``) by the clock,
after the caller saw it done (``query``: see ``timing.Intervals.collect``)."""

import ast
from pathlib import Path

import sglang_vlora.orchestrator as package

BLOCKING = {"synchronize", "item", "tolist", "cpu", "numpy", "wait"}


def calls(tree: ast.AST) -> list[tuple[str, int]]:
    return [
        (node.func.attr, node.lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    ]


def test_no_blocking_call_in_the_orchestrator():
    for path in sorted(Path(package.__file__).parent.glob("*.py")):
        found = [(name, line) for name, line in calls(ast.parse(path.read_text())) if name in BLOCKING]
        assert not found, f"{path.name}: host-blocking calls {found}"


def test_events_are_read_only_by_the_clock():
    tree = ast.parse((Path(package.__file__).parent / "runtime.py").read_text())
    clock = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "CudaClock")
    in_clock = {line for name, line in calls(clock)}
    reads = [line for name, line in calls(tree) if name in ("elapsed_time", "query")]
    assert reads and set(reads) <= in_clock
