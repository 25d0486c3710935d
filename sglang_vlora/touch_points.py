"""The kinds of SGLang touch point the plugin declares (:class:`Hook`, :class:`TouchPoint`), and
the checks run at start-up over the table in :mod:`sglang_vlora.sglang_hooks`.

The plugin is written against one SGLang release (:data:`SGLANG_PINNED`). SGLang's plugin API
only logs a hook on a target that does not resolve, and a renamed private attribute or a
reordered parameter would surface as an ``AttributeError`` or a wrong value deep inside a
request. So :func:`check` resolves every declared target, compares the leading parameters of
every wrapped or called function with the ones our code relies on, and looks for every
attribute our code reads on SGLang's objects; :func:`verify_applied` then checks that every
hook is in place. A failure names what moved, the installed SGLang and the pinned one.
"""

from __future__ import annotations

import dis
import functools
import importlib.metadata
import inspect
import pkgutil
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

SGLANG_PINNED = "0.5.23"
# What a TouchPoint is: how the plugin touches its target.
KINDS = ("registration", "route", "call", "read", "value", "bridge")


@dataclass(frozen=True)
class Hook:
    """An SGLang function wrapped through SGLang's ``HookRegistry``. ``fn`` is our side; its first
    parameter is what its group is bound to when registered (:func:`register`). ``params``: the
    leading parameters of the target our hook relies on (by position or by name)."""

    target: str
    kind: HookType
    fn: Callable
    why: str
    params: tuple[str, ...]


@dataclass(frozen=True)
class TouchPoint:
    """Anything else the plugin uses in SGLang (or replaces in torch): ``kind`` is one of
    :data:`KINDS`, ``ours`` where our code does it. ``params``: for a callable, the leading
    parameters our calls rely on; ``attrs``: attributes read (or set) on instances of a class
    (or on the object itself); ``listed``: names the target, a function that lists the names an
    object answers, must list; ``source_has``: names SGLang's source of the target must still
    use (an environment variable it reads); ``expected``: the value we copied, when not None."""

    kind: str
    target: str
    why: str
    ours: str
    params: tuple[str, ...] | None = None
    attrs: tuple[str, ...] = ()
    listed: tuple[str, ...] = ()
    source_has: tuple[str, ...] = ()
    expected: Any = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"touch point {self.target}: kind must be one of {KINDS}, got {self.kind!r}")


class SGLangMismatch(RuntimeError):
    """The installed SGLang is not the one the touch-point table was written for."""


def installed_sglang() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# ------------------------------------------------------------------ resolving
def resolve(target: str):
    """The object a dotted path names; a class's classmethod or staticmethod as its function."""
    obj = pkgutil.resolve_name(target)
    owner_path, _, attr = target.rpartition(".")
    owner = pkgutil.resolve_name(owner_path) if owner_path else None
    raw = owner.__dict__.get(attr) if isinstance(owner, type) else None
    if isinstance(raw, (classmethod, staticmethod)):
        return raw.__func__
    return obj


def _leading_params(obj) -> list[str]:
    return list(inspect.signature(obj).parameters)


def _code_objects(value) -> Iterable:
    """The code objects of a class member (function, classmethod, staticmethod, property)."""
    if isinstance(value, (classmethod, staticmethod)):
        value = value.__func__
    if isinstance(value, property):
        return [c for f in (value.fget, value.fset) for c in _code_objects(f)]
    value = inspect.unwrap(value) if callable(value) else value
    code = getattr(value, "__code__", None)
    return [code] if code is not None else []


def _stored_attrs(klass: type) -> set[str]:
    """Attribute names the methods of one class assign (``STORE_ATTR``, nested code included)."""
    names = set()
    pending = [code for value in vars(klass).values() for code in _code_objects(value)]
    while pending:
        code = pending.pop()
        names.update(i.argval for i in dis.get_instructions(code) if i.opname == "STORE_ATTR")
        pending.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return names


def has_attribute(cls: type, name: str, assigned: Callable[[type], set[str]] = _stored_attrs) -> bool:
    """Whether instances of ``cls`` have attribute ``name``: a class attribute, method or field,
    an annotation, or assigned by a method of the class or a base (``self.<name> = ...``)."""
    if hasattr(cls, name):
        return True
    for klass in cls.__mro__:
        if klass is object:
            continue
        if name in vars(klass).get("__annotations__", {}) or name in assigned(klass):
            return True
    return False


# ------------------------------------------------------------------ checking
def _signature_problem(obj, params: tuple[str, ...]) -> str | None:
    try:
        found = _leading_params(obj)
    except (TypeError, ValueError):
        return "has no signature to check"
    if found[: len(params)] != list(params):
        return f"parameters are ({', '.join(found)}), expected to start with ({', '.join(params)})"
    return None


def _attribute_problem(obj, attrs: tuple[str, ...], assigned) -> str | None:
    if isinstance(obj, type):
        missing = [a for a in attrs if not has_attribute(obj, a, assigned)]
    else:
        missing = [a for a in attrs if not hasattr(obj, a)]
    return f"no attribute {', '.join(missing)}" if missing else None


def _listed_problem(obj, names: tuple[str, ...]) -> str | None:
    try:
        listed = set(obj())
    except Exception as exc:  # it no longer lists names the same way
        return f"cannot list names ({type(exc).__name__}: {exc})"
    missing = [name for name in names if name not in listed]
    return f"does not list {', '.join(missing)}" if missing else None


def _source_problem(obj, names: tuple[str, ...]) -> str | None:
    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError):
        return "has no source to check"
    missing = [name for name in names if name not in source]
    return f"no longer uses {', '.join(missing)}" if missing else None


def _problems(target: str, params: tuple[str, ...] | None, point: TouchPoint | None, assigned) -> list[str]:
    """What moved about one target (an empty list: nothing)."""
    try:
        obj = resolve(target)
    except Exception as exc:  # any failure to import or find it means it moved
        return [f"{target}: not found ({type(exc).__name__}: {exc})"]
    found = [_signature_problem(obj, params) if params is not None else None]
    if point is not None:
        found += [
            _attribute_problem(obj, point.attrs, assigned) if point.attrs else None,
            _listed_problem(obj, point.listed) if point.listed else None,
            _source_problem(obj, point.source_has) if point.source_has else None,
            f"is {obj!r}, expected {point.expected!r}"
            if point.expected is not None and obj != point.expected else None,
        ]
    return [f"{target}: {problem}" for problem in found if problem is not None]


def check(hooks: Iterable[Hook], points: Iterable[TouchPoint]) -> None:
    """Raise :class:`SGLangMismatch` listing every declared target that moved."""
    assigned = functools.cache(_stored_attrs)  # one look per class in this check
    problems = []
    for hook in hooks:
        problems += [f"hook {p} (our {hook.fn.__module__}.{hook.fn.__name__})"
                     for p in _problems(hook.target, hook.params, None, assigned)]
    for point in points:
        problems += [f"{point.kind} {p} (our {point.ours})"
                     for p in _problems(point.target, point.params, point, assigned)]
    if problems:
        raise SGLangMismatch(
            f"sglang-vlora is written for SGLang {SGLANG_PINNED}, and the installed SGLang is "
            f"{installed_sglang()}; what the plugin touches in SGLang has moved:\n  - "
            + "\n  - ".join(problems)
            + f"\nInstall sglang=={SGLANG_PINNED}, or an sglang-vlora release made for SGLang {installed_sglang()}."
        )


# ------------------------------------------------------------------ hooks
def register(hooks: Iterable[Hook], first: object) -> None:
    """Register each hook with SGLang, its function bound to ``first`` (the runtime, or the
    plugin's ``turn_on`` for the argument hooks)."""
    for hook in hooks:
        HookRegistry.register(hook.target, functools.partial(hook.fn, first), hook.kind)


def _is_hook(value: object, hook_fn: Callable) -> bool:
    return value is hook_fn or (isinstance(value, functools.partial) and value.func is hook_fn)


def _wraps_hook(fn: Callable, hook_fn: Callable) -> bool:
    """Walk the ``__wrapped__`` chain; true if a wrapper closes over ``hook_fn`` (bound or not)."""
    seen = 0
    while fn is not None and seen < 32:
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                if _is_hook(cell.cell_contents, hook_fn):
                    return True
            except ValueError:
                continue
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    return False


def verify_applied(hooks: Iterable[Hook]) -> None:
    """Raise ``RuntimeError`` naming the first hook that is not in place."""
    for hook in hooks:
        try:
            current = resolve(hook.target)
        except Exception as exc:  # the target does not exist in this SGLang
            raise RuntimeError(f"sglang-vlora: hook target {hook.target} not found ({exc})") from exc
        if not _wraps_hook(current, hook.fn):
            raise RuntimeError(
                f"sglang-vlora: hook {hook.kind.value} {hook.target} did not apply "
                f"(needed because: {hook.why})"
            )
