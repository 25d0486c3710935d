"""The CPU compatibility layer: the sgl_kernel stand-in and its list of module-level
ops, re-derived from the installed SGLang's source."""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import sglang

from sglang_vlora.cpu_compat import STUB_DIR

STUB_PROBE = r"""
import json, torch, sgl_kernel
from sgl_kernel import some_gpu_op
import sgl_kernel.elementwise as sub
result = {"stub": sgl_kernel.IS_SGLANG_VLORA_STUB}
for name, fn in (("top", some_gpu_op), ("sub", sub.rmsnorm), ("ops", torch.ops.sgl_kernel.fused_sigmoid_mul_cpu)):
    try:
        fn(1)
    except NotImplementedError as exc:
        result[name] = str(exc)
try:
    import sgl_kernel.scalar_type
    result["scalar_type"] = "imported"
except ImportError:
    result["scalar_type"] = "missing"
result["amx_probe"] = hasattr(torch.ops.sgl_kernel, "convert_weight_packed")
print(json.dumps(result))
"""


def test_stub_imports_and_raises_clearly_when_called():
    env = dict(os.environ, PYTHONPATH=str(STUB_DIR))
    out = subprocess.run([sys.executable, "-c", STUB_PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["stub"] is True
    assert "sgl_kernel.some_gpu_op" in result["top"] and "CPU-only" in result["top"]
    assert "sgl_kernel.elementwise.rmsnorm" in result["sub"]
    assert "fused_sigmoid_mul_cpu" in result["ops"]
    # SGLang has its own fallback for this import: it must keep failing.
    assert result["scalar_type"] == "missing"
    # SGLang detects a CPU (AMX) build by this probe: it must stay False.
    assert result["amx_probe"] is False


def module_level_sgl_kernel_ops(root: Path) -> set[str]:
    """``torch.ops.sgl_kernel.<name>`` read outside any function, excluding reads
    guarded by an AMX check (never taken without a CPU build of sgl_kernel)."""
    found = set()
    for path in root.rglob("*.py"):
        if "multimodal_gen" in path.parts or "test" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue

        def visit(node, guarded_by_amx: bool):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                    continue
                guard = guarded_by_amx
                if isinstance(child, ast.If) and "amx" in ast.unparse(child.test).lower():
                    guard = True
                if (
                    isinstance(child, ast.Attribute)
                    and isinstance(child.value, ast.Attribute)
                    and child.value.attr == "sgl_kernel"
                    and isinstance(child.value.value, ast.Attribute)
                    and child.value.value.attr == "ops"
                    and not guard
                ):
                    found.add(child.attr)
                visit(child, guard)

        visit(tree, False)
    return found


def test_stub_covers_every_module_level_op_of_this_sglang():
    # Read the stub's list from its source: importing it here would install its
    # import hooks into the test process.
    stub_source = (STUB_DIR / "sgl_kernel" / "__init__.py").read_text()
    assignment = next(
        node for node in ast.parse(stub_source).body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "MODULE_LEVEL_OPS"
    )
    MODULE_LEVEL_OPS = ast.literal_eval(assignment.value.args[0])
    srt = Path(sglang.__file__).parent / "srt"
    needed = module_level_sgl_kernel_ops(srt)
    assert needed, "the scan found nothing: it is broken"
    assert needed <= set(MODULE_LEVEL_OPS), sorted(needed - set(MODULE_LEVEL_OPS))
