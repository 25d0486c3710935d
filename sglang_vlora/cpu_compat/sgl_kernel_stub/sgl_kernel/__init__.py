"""Import-only stand-in for ``sgl_kernel`` on machines without a GPU.

SGLang 0.5.23 imports ``sgl_kernel`` at module level in files that every server
process loads (the KV-cache mover, quantisation utilities, ...), but PyPI's
``sglang-kernel`` carries no CPU ops. On a CPU without AMX these ops are imported and
never called. This package satisfies those imports; any attribute, of this module or
of any ``sgl_kernel.<sub>`` module, is a function that raises ``NotImplementedError``
naming the op when called, so a CPU path that really needs a missing op fails loudly
instead of computing something else.

It is put on the import path by :mod:`sglang_vlora.cpu_compat` only when no GPU is
present and the real ``sgl_kernel`` cannot be imported.
"""

import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+sglang-vlora-cpu-stub"
IS_SGLANG_VLORA_STUB = True


def _missing_op(qualified: str):
    def op(*args, **kwargs):
        raise NotImplementedError(
            f"{qualified} is a GPU kernel from sglang-kernel and is not available on this "
            "CPU-only machine (sglang-vlora CPU compatibility stub). This code path needs "
            "a GPU or a CPU build of sglang-kernel."
        )

    op.__name__ = qualified.rsplit(".", 1)[-1]
    op.__qualname__ = qualified
    return op


def _attribute_factory(module_name: str):
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _missing_op(f"{module_name}.{name}")

    return __getattr__


__getattr__ = _attribute_factory("sgl_kernel")


# Submodules that SGLang imports inside ``try/except ImportError`` with its own
# pure-Python fallback: they must stay missing so that the fallback is used.
_LEFT_MISSING = {"sgl_kernel.scalar_type"}


class _SubmoduleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Makes ``import sgl_kernel.anything`` succeed with a module of missing ops."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("sgl_kernel.") and fullname not in _LEFT_MISSING:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = _attribute_factory(spec.name)
        return module

    def exec_module(self, module):
        return None


sys.meta_path.insert(0, _SubmoduleFinder())


# ``torch.ops.sgl_kernel.<op>`` is read at module level, on CPU, by files that the
# Qwen2-VL path imports (qwen3_5.py through the Qwen-VL processor, the GDN backend,
# grok.py); tests/unit/test_cpu_compat.py re-derives this set from SGLang's source. Only these names exist, as raising stubs: every other name stays absent,
# because SGLang probes ``hasattr(torch.ops.sgl_kernel, ...)`` to detect a CPU (AMX)
# build of sgl_kernel or to register fake kernels, and must keep its torch paths.
MODULE_LEVEL_OPS = frozenset(
    {
        "fused_dual_residual_rmsnorm_cpu",
        "fused_gdn_gating_cpu",
        "fused_moe_router_cpu",
        "fused_qk_gemma_rmsnorm_cpu",
        "fused_qk_gemma_rmsnorm_with_gate_cpu",
        "fused_qkvzba_split_reshape_cat_contiguous_cpu",
        "fused_sigmoid_gating_delta_rule_update_cpu",
        "fused_sigmoid_mul_cpu",
        "rmsnorm_cpu",
    }
)


class _TorchOpsNamespace:
    def __getattr__(self, name: str):
        if name in MODULE_LEVEL_OPS:
            return _missing_op(f"torch.ops.sgl_kernel.{name}")
        raise AttributeError(name)


def _install_torch_ops_namespace() -> None:
    import torch

    torch.ops.__dict__["sgl_kernel"] = _TorchOpsNamespace()


_install_torch_ops_namespace()
