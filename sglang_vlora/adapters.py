"""The V-LoRA adapter package: a PEFT LoRA adapter directory plus optional task heads.

Layout of one package directory::

    adapter_config.json          PEFT (written by ``peft``; SGLang loads it with --lora-paths)
    adapter_model.safetensors    PEFT LoRA weights
    vlora_head.json              optional: the heads (format below)
    vlora_head.safetensors       optional: tensors ``<task>.weight`` [labels, hidden], ``<task>.bias`` [labels]

``vlora_head.json``::

    {"format": "vlora-head", "version": 1, "hidden_size": 128,
     "heads": [{"task": "digit-parity", "task_type": "classification",
                "labels": ["even", "odd"], "pooling": "last",
                "prompt": "Is the digit even or odd?"}]}

An adapter that fuses several tasks carries one head per task that answers through a head.
SGLang drops non-LoRA tensors from adapter files, so heads live in their own files beside
the PEFT ones and are loaded with :func:`load_heads`. Imports torch and safetensors only.

:func:`check_package` is the one validation of a package: the server runs it before an
adapter enters SGLang (every tensor's shape against the model, dtype, finiteness; the config;
the heads), and ``python -m sglang_vlora.adapters check DIR [--model M]`` runs the same.
The format is described for users in ``adapters/README.md`` (schema of ``vlora_head.json``
in ``adapters/vlora_head.schema.json``).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from sglang_vlora.heads.task_head import HeadSpec, TaskHead

HEAD_CONFIG = "vlora_head.json"
HEAD_WEIGHTS = "vlora_head.safetensors"
HEAD_FORMAT = "vlora-head"
HEAD_VERSION = 1


def save_heads(heads: Iterable[TaskHead], adapter_dir: Path | str) -> None:
    """Write ``vlora_head.json`` + ``vlora_head.safetensors`` for ``heads`` into ``adapter_dir``.

    Writes nothing when ``heads`` is empty (an adapter without heads is a plain PEFT dir).
    """
    heads = list(heads)
    if not heads:
        return
    hidden = {h.hidden_size for h in heads}
    if len(hidden) != 1:
        raise ValueError(f"heads of one adapter must share the hidden size, got {sorted(hidden)}")
    tasks = [h.spec.task for h in heads]
    if len(set(tasks)) != len(tasks):
        raise ValueError(f"duplicate head tasks: {tasks}")
    adapter_dir = Path(adapter_dir)
    adapter_dir.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for head in heads:
        tensors[f"{head.spec.task}.weight"] = (
            head.linear.weight.detach().to(torch.float32).contiguous().clone()
        )
        tensors[f"{head.spec.task}.bias"] = head.linear.bias.detach().to(torch.float32).contiguous().clone()
    save_file(tensors, str(adapter_dir / HEAD_WEIGHTS))
    config = {
        "format": HEAD_FORMAT,
        "version": HEAD_VERSION,
        "hidden_size": hidden.pop(),
        "heads": [h.spec.to_json() for h in heads],
    }
    (adapter_dir / HEAD_CONFIG).write_text(json.dumps(config, indent=2) + "\n")


def read_head_config(adapter_dir: Path | str) -> dict[str, Any] | None:
    """The parsed and checked ``vlora_head.json`` of a package, or ``None`` when it has no heads.

    Raises :class:`AdapterError` naming the field and the fix when the file is malformed."""
    path = Path(adapter_dir) / HEAD_CONFIG
    if not path.exists():
        return None
    return check_head_config(_read_json(path))


def load_heads(adapter_dir: Path | str, hidden_size: int) -> dict[str, TaskHead]:
    """Load every head of a package, keyed by task name; ``{}`` when it has none.

    ``hidden_size`` is the model's (text) hidden size; a head of another width, or tensors
    that do not fit the label count, raise ``ValueError`` naming the head and both shapes.
    """
    config = read_head_config(adapter_dir)
    if config is None:
        return {}
    if int(config["hidden_size"]) != hidden_size:
        raise AdapterError(
            f"{adapter_dir}: heads were trained for hidden size {config['hidden_size']}, "
            f"the model has hidden size {hidden_size}"
        )
    tensors = _head_tensors(Path(adapter_dir), config)
    heads = {}
    for entry in config["heads"]:
        spec = HeadSpec.from_json(entry)
        head = TaskHead(spec, hidden_size)
        head.linear.load_state_dict({k: tensors[f"{spec.task}.{k}"] for k in ("weight", "bias")})
        heads[spec.task] = head.eval()
    return heads


def load_head(adapter_dir: Path | str, hidden_size: int, task: str | None = None) -> TaskHead | None:
    """One head of a package: the one named ``task``, or the only one when ``task`` is None.

    Returns ``None`` when the package has no heads; raises ``KeyError`` for an unknown task and
    ``ValueError`` when ``task`` is None but the package has several heads.
    """
    heads = load_heads(adapter_dir, hidden_size)
    if not heads:
        return None
    if task is None:
        if len(heads) > 1:
            raise ValueError(f"{adapter_dir} has heads {sorted(heads)}: name the task")
        return next(iter(heads.values()))
    if task not in heads:
        raise KeyError(f"{adapter_dir} has no head for task {task!r} (heads: {sorted(heads)})")
    return heads[task]


def save_adapter_package(
    out_dir: Path | str, peft_model: Any = None, heads: Iterable[TaskHead] = (), adapter_name: str = "default"
) -> Path:
    """Write a package: the PEFT adapter ``adapter_name`` of ``peft_model`` (a ``peft.PeftModel``;
    skipped when None) and the heads. Returns ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if peft_model is not None:
        peft_model.save_pretrained(str(out_dir), selected_adapters=[adapter_name])
        nested = out_dir / adapter_name
        if adapter_name != "default" and nested.is_dir():
            # peft nests non-default adapters in a sub-folder; a package is flat.
            for item in nested.iterdir():
                item.replace(out_dir / item.name)
            nested.rmdir()
    save_heads(heads, out_dir)
    return out_dir


# ------------------------------------------------------------------ validation
class AdapterError(ValueError):
    """A package that cannot be served; the message names the file or tensor and the fix."""


PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# PEFT module names SGLang stacks into one LoRA layer (its normalized target names).
STACKED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
           "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}
_LAYER_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:.*\.)?(\w+)\.(lora_A|lora_B)(?:\.\w+)?\.weight$")
_EMBED_KEY = re.compile(r"(?:^|\.)(embed_tokens|lm_head)\.(lora_embedding_A|lora_embedding_B|lora_A|lora_B)(?:\.\w+)?(?:\.weight)?$")
_TASK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
# Parts of a VLM outside its language model (their layers have other shapes): not checked
# against the language model's features.
_OUTSIDE_LM = ("visual.", "vision_tower.", "vision_model.", "multi_modal_projector.", "mm_projector.")
# Expert weights have their own widths (moe_intermediate_size ...): checked for rank only.
_EXPERTS = (".experts.", ".shared_expert.", ".shared_experts.")


@dataclass(frozen=True)
class ModelShapes:
    """What an adapter must fit: layer count and, per PEFT module name, ``(in, out)`` features."""

    layers: int
    hidden_size: int
    vocab_size: int
    modules: dict[str, tuple[int, int]]

    @classmethod
    def from_config(cls, config: Any) -> ModelShapes:
        """From a ``transformers`` config or a ``config.json`` dict (a VLM's text config is used)."""
        if isinstance(config, Mapping):
            text = {**config, **(config.get("text_config") or {})}
        else:
            text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
            text = {k: getattr(text_config, k, None) for k in (
                "num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "head_dim", "vocab_size")}
            if text["vocab_size"] is None:
                text["vocab_size"] = getattr(config, "vocab_size", None)
        hidden, heads = int(text["hidden_size"]), int(text["num_attention_heads"])
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or hidden // heads)
        inter = int(text["intermediate_size"])
        q, kv = heads * head_dim, kv_heads * head_dim
        modules = {
            "q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
            "qkv_proj": (hidden, q + 2 * kv), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "gate_up_proj": (hidden, 2 * inter), "down_proj": (inter, hidden),
        }
        return cls(int(text["num_hidden_layers"]), hidden, int(text["vocab_size"]), modules)

    @classmethod
    def from_model_dir(cls, model_dir: Path | str) -> ModelShapes:
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise AdapterError(f"--model {model_dir}: no config.json there (give the model's folder)")
        return cls.from_config(_read_json(path))


@dataclass
class PackageReport:
    """What :func:`check_package` found in a package that passed."""

    path: str
    rank: int
    alpha: float
    target_modules: list[str] | str
    tensors: int
    layers: list[int]
    heads: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterError(f"{path.name}: not readable JSON ({exc}); rewrite it") from exc


def check_package(
    adapter_dir: Path | str,
    model: ModelShapes | None = None,
    max_rank: int | None = None,
    served_modules: Iterable[str] | None = None,
) -> PackageReport:
    """Check a package before it is served; raise :class:`AdapterError` with the first problem.

    ``model``: every LoRA tensor must fit its layer and module (without it, only A/B
    agreement is checked). ``max_rank``: the server's ``--max-lora-rank``.
    ``served_modules``: the server's LoRA target modules (SGLang's stacked names).
    """
    root = Path(adapter_dir)
    if not root.is_dir():
        raise AdapterError(f"lora_path {str(adapter_dir)!r}: no such folder (give the folder holding {PEFT_CONFIG})")
    if not (root / PEFT_CONFIG).is_file():
        raise AdapterError(f"{adapter_dir}: no {PEFT_CONFIG} (a package is a PEFT adapter folder: save it with peft)")
    report = check_lora(_read_json(root / PEFT_CONFIG), _read_weights(root), model, max_rank, served_modules)
    report.path = str(root)
    head_config = read_head_config(root)
    if head_config is not None:
        if model is not None and int(head_config["hidden_size"]) != model.hidden_size:
            raise AdapterError(
                f"{HEAD_CONFIG}: heads were trained for hidden size {head_config['hidden_size']}, "
                f"the model has hidden size {model.hidden_size}"
            )
        _head_tensors(root, head_config)
        report.heads = [entry["task"] for entry in head_config["heads"]]
    return report


def check_lora(
    config: Any,
    tensors: Mapping[str, Any],
    model: ModelShapes | None = None,
    max_rank: int | None = None,
    served_modules: Iterable[str] | None = None,
) -> PackageReport:
    """The LoRA part of :func:`check_package` for a parsed ``adapter_config.json`` and its
    tensors (also what ``/load_lora_adapter_from_tensors`` sends)."""
    rank, alpha, targets = _check_peft_config(config, max_rank, served_modules)
    report = PackageReport("", rank, alpha, targets, len(tensors), [])
    _check_lora_tensors(tensors, rank, model, report)
    return report


def _check_peft_config(
    config: Any, max_rank: int | None, served_modules: Iterable[str] | None
) -> tuple[int, float, list[str] | str]:
    where = PEFT_CONFIG
    if not isinstance(config, dict):
        raise AdapterError(f"{where}: must be a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{where}: peft_type is {config.get('peft_type')!r}; only LORA adapters are served")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise AdapterError(f"{where}: r (the LoRA rank) must be an integer >= 1, got {rank!r}")
    if max_rank is not None and rank > max_rank:
        raise AdapterError(
            f"{where}: rank {rank} is above the server's --max-lora-rank {max_rank}; "
            f"start the server with --max-lora-rank {rank} or use an adapter of rank <= {max_rank}"
        )
    alpha = config.get("lora_alpha")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise AdapterError(f"{where}: lora_alpha must be a finite number, got {alpha!r}")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise AdapterError(f"{where}: rank_pattern / alpha_pattern are not supported (one rank and alpha per adapter)")
    if config.get("use_dora"):
        raise AdapterError(f"{where}: DoRA adapters (use_dora) are not supported; train a plain LoRA")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        if targets not in ("all", "all-linear"):
            raise AdapterError(f"{where}: target_modules as a string must be 'all' or 'all-linear', got {targets!r}")
        return rank, float(alpha), targets
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
        raise AdapterError(f"{where}: target_modules must be a non-empty list of module names, got {targets!r}")
    if served_modules is not None:
        served = set(served_modules)
        missing = sorted({t for t in targets if STACKED.get(t, t) not in served})
        if missing:
            raise AdapterError(
                f"{where}: target module(s) {missing} are not served by this server "
                f"(its LoRA target modules: {sorted(served)}); start it with --lora-target-modules "
                "naming them, or train the adapter on served modules"
            )
    return rank, float(alpha), list(targets)


def _read_weights(root: Path) -> dict[str, torch.Tensor]:
    for name in PEFT_WEIGHTS:
        path = root / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                return load_file(str(path))
            return torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:  # any reader error means a damaged file
            raise AdapterError(f"{name}: cannot be read ({type(exc).__name__}: {exc}); save the adapter again") from exc
    raise AdapterError(f"{root}: no {' or '.join(PEFT_WEIGHTS)} (the LoRA weights are missing)")


def _check_tensor(key: str, tensor: Any) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise AdapterError(f"tensor {key}: not a tensor")
    if tensor.dtype not in FLOAT_DTYPES:
        raise AdapterError(f"tensor {key}: dtype {tensor.dtype} is not floating point (save fp16, bf16 or fp32)")
    if not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).sum())
        raise AdapterError(f"tensor {key}: {bad} of {tensor.numel()} values are NaN or infinite; retrain or fix it")


def _check_lora_tensors(
    tensors: Mapping[str, Any], rank: int, model: ModelShapes | None, report: PackageReport
) -> None:
    pairs: dict[str, dict[str, tuple[str, Any]]] = {}
    layers: set[int] = set()
    for key, tensor in tensors.items():
        layer_match, embed_match = _LAYER_KEY.search(key), _EMBED_KEY.search(key)
        if (layer_match is None and embed_match is None) or any(part in key for part in _OUTSIDE_LM):
            if "lora_" in key:
                report.warnings.append(f"tensor {key}: outside the language model's layers; not checked")
            continue
        _check_tensor(key, tensor)
        if tensor.dim() != 2:
            raise AdapterError(f"tensor {key}: must be 2-D, has shape {tuple(tensor.shape)}")
        if layer_match is not None:
            layer, module, side = int(layer_match.group(1)), layer_match.group(2), layer_match.group(3)[-1]
            if model is not None and layer >= model.layers:
                raise AdapterError(f"tensor {key}: layer {layer}, the model has {model.layers} layers (0..{model.layers - 1})")
            layers.add(layer)
            _check_layer_shape(key, tensor, module, side, rank, model)
            pairs.setdefault(key[: layer_match.start(3)], {})[side] = (key, tensor)
        else:
            _check_embedding_shape(key, tensor, embed_match.group(1), embed_match.group(2), rank, model)
    for prefix, sides in sorted(pairs.items()):
        if set(sides) != {"A", "B"}:
            raise AdapterError(f"module {prefix.rstrip('.')}: has lora_{''.join(sides)} without its partner")
    if not pairs:
        raise AdapterError("the weights hold no LoRA tensor of the model's layers (keys ...layers.N.<module>.lora_A.weight)")
    report.layers = sorted(layers)


def _check_layer_shape(key: str, tensor: torch.Tensor, module: str, side: str, rank: int, model: ModelShapes | None) -> None:
    shape = tuple(tensor.shape)
    ranks = shape[0] if side == "A" else shape[1]
    if ranks != rank:
        raise AdapterError(f"tensor {key}: shape {shape} has rank {ranks}, {PEFT_CONFIG} says r={rank}")
    features = model.modules.get(module) if model is not None and not any(p in key for p in _EXPERTS) else None
    if features is None:
        return  # a module whose widths the model config does not give: rank checked only
    want = (rank, features[0]) if side == "A" else (features[1], rank)
    if shape != want:
        raise AdapterError(
            f"tensor {key}: shape {shape} does not fit the model's {module} "
            f"({features[0]} -> {features[1]} features): expected {want}; the adapter was trained for another model"
        )


def _check_embedding_shape(
    key: str, tensor: torch.Tensor, module: str, kind: str, rank: int, model: ModelShapes | None
) -> None:
    if model is None:
        return
    vocab, hidden = model.vocab_size, model.hidden_size
    want = {
        ("embed_tokens", "lora_embedding_A"): (rank, vocab), ("embed_tokens", "lora_embedding_B"): (hidden, rank),
        ("lm_head", "lora_A"): (rank, hidden), ("lm_head", "lora_B"): (vocab, rank),
    }.get((module, kind))
    if want is not None and tuple(tensor.shape) != want:
        raise AdapterError(f"tensor {key}: shape {tuple(tensor.shape)} does not fit the model's {module}: expected {want}")


def check_head_config(config: Any) -> dict[str, Any]:
    """Check a parsed ``vlora_head.json`` (schema: ``adapters/vlora_head.schema.json``); returns it."""
    where = HEAD_CONFIG
    if not isinstance(config, dict):
        raise AdapterError(f"{where}: must be a JSON object")
    if config.get("format") != HEAD_FORMAT or config.get("version") != HEAD_VERSION:
        raise AdapterError(f'{where}: needs "format": "{HEAD_FORMAT}" and "version": {HEAD_VERSION}')
    hidden = config.get("hidden_size")
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
        raise AdapterError(f"{where}: hidden_size must be a positive integer (the model's hidden size), got {hidden!r}")
    heads = config.get("heads")
    if not isinstance(heads, list) or not heads:
        raise AdapterError(f"{where}: heads must be a non-empty list (delete the file for an adapter without heads)")
    tasks = []
    for i, entry in enumerate(heads):
        at = f"{where}: heads[{i}]"
        if not isinstance(entry, dict):
            raise AdapterError(f"{at} must be an object")
        for name in ("task", "labels", "prompt"):
            if name not in entry:
                raise AdapterError(f"{at} has no {name!r} (each head needs task, labels and prompt)")
        task, labels = entry["task"], entry["labels"]
        if not isinstance(task, str) or not _TASK_NAME.match(task):
            raise AdapterError(f"{at}.task must be 1-64 letters, digits, '.', '_' or '-', got {task!r}")
        if not isinstance(labels, list) or not all(isinstance(label, str) for label in labels):
            raise AdapterError(f"{at}.labels must be a list of strings")
        if not isinstance(entry["prompt"], str):
            raise AdapterError(f"{at}.prompt must be a string")
        try:
            HeadSpec.from_json(entry)
        except ValueError as exc:
            raise AdapterError(f"{at}: {exc}") from exc
        tasks.append(task)
    if len(set(tasks)) != len(tasks):
        raise AdapterError(f"{where}: duplicate head tasks {tasks}")
    return config


def _head_tensors(root: Path, config: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The head tensors, each checked against its head's labels and the hidden size."""
    path = root / HEAD_WEIGHTS
    if not path.is_file():
        raise AdapterError(f"{HEAD_CONFIG} names heads but {HEAD_WEIGHTS} is missing")
    try:
        tensors = load_file(str(path))
    except Exception as exc:  # any reader error means a damaged file
        raise AdapterError(f"{HEAD_WEIGHTS}: cannot be read ({type(exc).__name__}: {exc})") from exc
    hidden = int(config["hidden_size"])
    for entry in config["heads"]:
        task, labels = entry["task"], len(entry["labels"])
        for name, shape in (("weight", (labels, hidden)), ("bias", (labels,))):
            key = f"{task}.{name}"
            if key not in tensors:
                raise AdapterError(f"{HEAD_WEIGHTS}: no tensor {key!r} for head {task!r}")
            _check_tensor(f"{HEAD_WEIGHTS}:{key}", tensors[key])
            if tuple(tensors[key].shape) != shape:
                raise AdapterError(
                    f"head {task!r}: {name} has shape {tuple(tensors[key].shape)}, expected {shape} "
                    f"({labels} labels x hidden size {hidden})"
                )
    return {k: v.to(torch.float32) for k, v in tensors.items()}


# ------------------------------------------------------------------------ CLI
def main(argv: list[str] | None = None) -> int:
    """``python -m sglang_vlora.adapters check DIR... [--model M] [--max-lora-rank N]``."""
    parser = argparse.ArgumentParser(prog="python -m sglang_vlora.adapters", description="V-LoRA adapter packages")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="validate packages with the checks the server runs at load")
    check.add_argument("dirs", nargs="+", metavar="DIR")
    check.add_argument("--model", help="the model's folder (config.json): check every tensor's shape against it")
    check.add_argument("--max-lora-rank", type=int, help="the server's --max-lora-rank")
    check.add_argument(
        "--lora-target-modules", nargs="+", metavar="MODULE",
        help="the server's --lora-target-modules: refuse adapters on other modules",
    )
    args = parser.parse_args(argv)
    failed = 0
    try:
        model = ModelShapes.from_model_dir(args.model) if args.model else None
    except AdapterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    served = {STACKED.get(t, t) for t in args.lora_target_modules} if args.lora_target_modules else None
    for directory in args.dirs:
        try:
            report = check_package(directory, model, args.max_lora_rank, served)
        except AdapterError as exc:
            failed += 1
            print(f"FAIL {directory}: {exc}")
            continue
        heads = f", heads {report.heads}" if report.heads else ""
        print(f"ok   {directory}: rank {report.rank}, {report.tensors} tensors on layers "
              f"{report.layers[0]}..{report.layers[-1]}{heads}")
        for warning in report.warnings:
            print(f"     warning: {warning}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
