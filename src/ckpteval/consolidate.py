"""Turn whatever a training run wrote into a verified Hugging Face directory that vLLM loads.

`consolidate_checkpoint` opens a checkpoint through its format (`ckpteval.formats`), then, the same
way for every format:

1. copies `config.json` (with the output dtype), tokenizer files and chat template from the
   checkpoint, or from the run's `base_model` where the checkpoint lacks them;
2. builds the architecture of `config.json` on the `meta` device (no memory, no weights) and maps
   the checkpoint's tensor names onto it: wrapper segments (`_orig_mod.`, `_fsdp_wrapped_module.`,
   ...) are dropped, and the leading prefix under which the most names fit the architecture
   (`""`, `model.`, `module.`, `state_dict.`, ...) is the model; everything outside it (optimizer
   state, step counters) is ignored. Then no tensor may be missing, none under the prefix may be
   unexpected, every shape must match, and tied weights stored twice must be equal;
3. writes the weights as safetensors in the output dtype, streamed tensor by tensor (or hard-links
   the source files when they are already exactly right: no copy);
4. hashes the weights (name, dtype, shape and bytes of every tensor, streamed): the model's
   identity for caches and lineage downstream;
5. runs a smoke generation (greedy, a few tokens, fixed prompt) through vLLM in a subprocess (the
   engine the infer step uses; the process exit frees its memory) or transformers on CPU, and
   fails on NaN/inf logits or empty output;
6. renames the staged directory into place and writes the manifest last.

Manifest schema (`models/{run}/{ckpt}.json`): source (the checkpoint's path, or its `s3://` URL),
local_copy (on S3: the downloaded copy consolidated), format, base_model, dtype, architecture,
param_count, weights_sha256, tensors {n, missing, unexpected, ignored, tied_dropped},
files [{name, bytes, how (hardlink|symlink|written|copied), from}], notes, smoke {engine, prompt,
text, token_ids, seconds}, ckpteval_version, consolidate_version, seconds; the workflow adds
the model's identity and source_files (per file read: sha256 and stat, or on S3 size and ETag).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckpteval import __version__
from ckpteval.errors import UserError
from ckpteval.formats import detect_format, get_format
from ckpteval.formats.base import SourceCheckpoint, TensorRef, checkpoint_error, in_memory
from ckpteval.formats.safetensors_io import (
    INDEX_NAME,
    SINGLE_NAME,
    read_header,
    summarize_weights,
    write_file,
)
from ckpteval.io import read_json, sha256_json, user_cache_dir, write_json

if TYPE_CHECKING:
    import torch

log = logging.getLogger("ckpteval.consolidate")

# Bump when the bytes of a consolidated directory change for the same input.
CONSOLIDATE_VERSION = "1"
DTYPES = ("bfloat16", "float16", "float32")
SMOKE_ENGINES = ("vllm", "transformers", "none")
SMOKE_PROMPT = "The capital of France is"
SMOKE_TOKENS = 8
SMOKE_SEED = 42
#: The longest context a vLLM smoke test asks for: the prompt and its tokens fit many times over,
#: and its KV cache fits in any memory fraction (the model's own maximum may not).
SMOKE_MAX_MODEL_LEN = 256
MAX_SHARD_BYTES = 4 << 30
FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
# Module-wrapper name segments that never belong to a Hugging Face parameter name.
WRAPPER_SEGMENTS = frozenset(
    {"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_forward_module"}
)
MAX_PREFIX_DEPTH = 4
CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "spiece.model",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
)
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
TEMPLATE_DIR = "additional_chat_templates"
TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")


@dataclass(frozen=True)
class Architecture:
    """The tensors `config.json`'s model class expects, under their names in saved checkpoints.

    `shapes` is in the model's state-dict order. `aliases` maps a tied parameter's second name to
    the first (`lm_head.weight` -> `model.embed_tokens.weight`): a checkpoint needs only one of
    them. The patterns are the model class's own `_keys_to_ignore_on_load_*`.

    Where transformers stores weights differently in memory than on disk (fused MoE experts in
    transformers 5), `module_shapes` lists the in-memory names that a trainer's raw state dict
    (DCP, torch.save) carries, and `to_saved` converts such a state dict to on-disk names.
    """

    name: str
    shapes: dict[str, tuple[int, ...]]
    aliases: dict[str, str]
    ignore_missing: tuple[re.Pattern[str], ...] = ()
    ignore_unexpected: tuple[re.Pattern[str], ...] = ()
    module_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    to_saved: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None = None


@dataclass(frozen=True)
class Planned:
    """One output tensor: its Hugging Face name, where it comes from, its output dtype."""

    name: str
    ref: TensorRef
    dtype: torch.dtype


@dataclass(frozen=True)
class TensorPlan:
    """The output tensors in architecture order, and what was left out of the checkpoint.

    `tied` holds the second copies of tied weights the checkpoint stored (`lm_head.weight`), which
    are checked against the first and not written.
    """

    tensors: list[Planned]
    prefix: str
    ignored: int
    tied: dict[str, TensorRef]

    @property
    def tied_dropped(self) -> list[str]:
        return sorted(self.tied)


def consolidate_checkpoint(
    source: Path,
    out_dir: Path,
    manifest_path: Path,
    *,
    fmt: str = "auto",
    base_model: Path | None = None,
    dtype: str = "bfloat16",
    smoke: str = "vllm",
    engine_args: dict[str, Any] | None = None,
    max_shard_bytes: int = MAX_SHARD_BYTES,
    record: dict[str, Any] | None = None,
    origin: str | None = None,
) -> dict[str, Any]:
    """Consolidate `source` into `out_dir` and write its manifest to `manifest_path`; return it.

    `out_dir` appears only when complete (staged in `out_dir.parent/.{name}.tmp-*`, then renamed;
    an old one is replaced, never half-overwritten). A checkpoint a user got wrong raises a
    `UserError` with one line naming the checkpoint, the file and the problem, and leaves neither
    the directory nor the manifest behind.

    `fmt` is a name in `ckpteval.formats.FORMATS` or "auto" (also None/""). `base_model` supplies
    config and tokenizer files the checkpoint lacks, and a LoRA adapter's base weights.
    `dtype` is the output dtype of floating-point weights. `smoke` picks the engine of the smoke
    generation ("vllm", "transformers", "none"); `engine_args` go to `vllm.LLM` (keys it does not
    know are left out). `max_shard_bytes` bounds each written safetensors file. `record` is
    merged into the manifest (the workflow's identity of the model, the source's file hashes).
    `origin` is where the checkpoint really is when `source` is a local copy of it (an S3
    checkpoint's `s3://` URL): the manifest's `source`, the copy's path its `local_copy`.
    """
    started = time.monotonic()
    source, out_dir, manifest_path = Path(source), Path(out_dir), Path(manifest_path)
    if dtype not in DTYPES:
        raise UserError(f"consolidate dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    if smoke not in SMOKE_ENGINES:
        raise UserError(f"consolidate smoke {smoke!r}: use one of {', '.join(SMOKE_ENGINES)}")
    if not source.exists():
        raise UserError(f"{source}: checkpoint not found")
    if base_model is not None and not Path(base_model).is_dir():
        raise UserError(f"base_model {base_model}: not a directory")
    base_model = Path(base_model).absolute() if base_model is not None else None
    fmt_name = detect_format(source) if fmt in ("auto", "", None) else get_format(fmt).name
    fmt_obj = get_format(fmt_name)
    if not fmt_obj.is_complete(source):
        # Opening names the precise problem when there is one (a truncated shard, ...).
        fmt_obj.open(source, base_model, dtype)
        raise checkpoint_error(
            source,
            None,
            f"incomplete {fmt_name} checkpoint (needs {fmt_obj.markers}); still being written?",
        )
    log.info("consolidating %s (%s) into %s as %s", source, fmt_name, out_dir, dtype)
    staging = _new_staging(out_dir)
    try:
        ckpt = fmt_obj.open(source, base_model, dtype)
        files = copy_side_files(ckpt, base_model, staging, dtype)
        arch = expected_tensors(staging, source, Path(files[0]["from"]))
        plan = plan_tensors(ckpt, arch, _torch_dtype(dtype))
        check_tied(ckpt, arch, plan)
        files += write_weights(ckpt, plan, staging, max_shard_bytes)
        summary = summarize_weights(staging)
        log.info(
            "%d tensors, %d parameters, sha256 %s", summary.tensors, summary.params, summary.sha256
        )
        smoke_result = smoke_check(staging, smoke, dtype, engine_args or {}, source)
        base = ckpt.base_dir or base_model
        manifest = {
            "source": origin or os.path.abspath(source),
            **({"local_copy": os.path.abspath(source)} if origin else {}),
            "format": fmt_name,
            "base_model": str(base) if base else None,
            "dtype": dtype,
            "architecture": arch.name,
            "param_count": summary.params,
            "weights_sha256": summary.sha256,
            "tensors": {
                "n": summary.tensors,
                "missing": [],
                "unexpected": [],
                "ignored": plan.ignored + ckpt.non_tensors,
                "tied_dropped": plan.tied_dropped,
            },
            "files": files,
            "notes": ckpt.notes + _plan_notes(plan),
            "smoke": smoke_result,
            "ckpteval_version": __version__,
            "consolidate_version": CONSOLIDATE_VERSION,
            "seconds": round(time.monotonic() - started, 3),
            **(record or {}),
        }
        _publish(staging, out_dir, manifest_path)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _write_json(manifest_path, manifest)
    log.info("wrote %s in %.1f s", out_dir, manifest["seconds"])
    return manifest


def _torch_dtype(dtype: str) -> torch.dtype:
    import torch

    return getattr(torch, dtype)


def _plan_notes(plan: TensorPlan) -> list[str]:
    notes = []
    casts = Counter(
        f"{p.ref.dtype} -> {p.dtype}".replace("torch.", "")
        for p in plan.tensors
        if p.ref.dtype != p.dtype
    )
    notes += [f"cast {n} tensor(s) {how}" for how, n in sorted(casts.items())]
    if plan.prefix:
        notes.append(f"model tensors found under prefix {plan.prefix!r}")
    if plan.ignored:
        notes.append(f"ignored {plan.ignored} tensors outside the model (optimizer state, ...)")
    return notes


# ---- side files -------------------------------------------------------------------------------


def copy_side_files(
    ckpt: SourceCheckpoint, base_model: Path | None, staging: Path, dtype: str
) -> list[dict[str, Any]]:
    """Copy config, tokenizer and chat template into `staging`; `config.json` gets `dtype`.

    Each group comes from the checkpoint when it has it, else from its base model.
    """
    base_model = ckpt.base_dir or base_model
    config_dir = ckpt.base_dir or _first_with(
        [ckpt.meta_dir, base_model], lambda d: (d / "config.json").is_file()
    )
    if config_dir is None:
        raise checkpoint_error(
            ckpt.path,
            None,
            "no config.json in the checkpoint and no base_model to take it from: "
            "set base_model for this run",
        )
    tokenizer_dir = tokenizer_source(ckpt.meta_dir, base_model)
    if tokenizer_dir is None:
        raise checkpoint_error(
            ckpt.path,
            None,
            "no tokenizer files in the checkpoint and no base_model to take them "
            "from: set base_model for this run",
        )
    records: list[dict[str, Any]] = []
    config = read_json(config_dir / "config.json")
    config["dtype"] = dtype
    if "torch_dtype" in config:
        config["torch_dtype"] = dtype
    _write_json(staging / "config.json", config)
    records.append(_record(staging / "config.json", "copied", config_dir / "config.json"))
    for name in CONFIG_FILES[1:]:
        records += _copy_if_present(config_dir / name, staging / name)
    for name in TOKENIZER_FILES + TEMPLATE_FILES:
        records += _copy_if_present(tokenizer_dir / name, staging / name)
    if (tokenizer_dir / TEMPLATE_DIR).is_dir():
        shutil.copytree(tokenizer_dir / TEMPLATE_DIR, staging / TEMPLATE_DIR)
        records.append(_record(staging / TEMPLATE_DIR, "copied", tokenizer_dir / TEMPLATE_DIR))
    origin = template_origin(ckpt.meta_dir, base_model)
    if origin is not None and origin != tokenizer_dir:
        for name in TEMPLATE_FILES:
            records += _copy_if_present(origin / name, staging / name)
    return records


def _write_json(path: Path, obj: Any) -> None:
    """`write_json` (atomic), readable by everyone like the weights next to it."""
    write_json(path, obj)
    path.chmod(0o644)


def _first_with(dirs: Iterable[Path | None], test: Any) -> Path | None:
    return next((d for d in dirs if d is not None and test(d)), None)


def tokenizer_source(meta_dir: Path | None, base_model: Path | None) -> Path | None:
    """Where a checkpoint's tokenizer files come from: its own directory when it has them, else
    its base model's (None: neither has any)."""
    return _first_with(
        [meta_dir, base_model], lambda d: any((d / m).is_file() for m in TOKENIZER_MARKERS)
    )


def template_origin(meta_dir: Path | None, base_model: Path | None) -> Path | None:
    """The directory whose chat template a consolidated model carries (None: it will have none):
    the tokenizer's (`tokenizer_source`) when that holds one, else the base model's template
    files. `copy_side_files` copies from it and the parse's warning about checkpoints without a
    template reads it (ckpteval.chat_templates), so the two never disagree."""
    tokenizer_dir = tokenizer_source(meta_dir, base_model)
    if tokenizer_dir is not None and has_chat_template(tokenizer_dir):
        return tokenizer_dir
    if base_model is not None and any((base_model / name).is_file() for name in TEMPLATE_FILES):
        return base_model
    return None


def has_chat_template(model_dir: Path) -> bool:
    """Whether a model directory carries a chat template (the files transformers reads); a
    malformed tokenizer_config.json is a `UserError` naming it."""
    if any((model_dir / name).is_file() for name in TEMPLATE_FILES):
        return True
    config = model_dir / "tokenizer_config.json"
    return config.is_file() and bool(read_json(config).get("chat_template"))


def _copy_if_present(src: Path, dst: Path) -> list[dict[str, Any]]:
    if not src.is_file():
        return []
    shutil.copyfile(src, dst)
    return [_record(dst, "copied", src)]


def _record(path: Path, how: str, origin: Path | None) -> dict[str, Any]:
    """One `files` entry of the manifest (a directory counts its files' bytes)."""
    if path.is_dir():
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    else:
        size = path.stat().st_size
    return {
        "name": path.name,
        "bytes": size,
        "how": how,
        "from": os.path.abspath(origin) if origin else None,
    }


# ---- verification -----------------------------------------------------------------------------


def expected_tensors(config_dir: Path, source: Path, origin: Path) -> Architecture:
    """Build `config_dir/config.json`'s model on the meta device and list its tensors.

    Names are those of saved checkpoints: where transformers converts weights on load (fused MoE
    experts in transformers 5), its own reverse conversion gives the on-disk names and shapes.
    `origin` is where that config.json was copied from, for error messages.

    Importing transformers' model classes costs seconds of CPU (its generation utilities import
    scikit-learn), more than the rest of consolidating a small checkpoint, and every checkpoint
    of a run has the same config: the list is kept in `user_cache_dir()/architectures/`, under
    the config's bytes and the transformers and torch versions (`_architecture_key`), and read
    back instead. Only a list that is data alone is kept (not one that converts weights on
    load); a cache file that does not read back is built again.
    """
    try:
        key = _architecture_key(config_dir / "config.json")
    except OSError:  # no readable config.json: transformers' own message names the problem
        return _built_architecture(config_dir, source, origin)
    cached = _read_architecture(key)
    if cached is not None:
        return cached
    arch = _built_architecture(config_dir, source, origin)
    _keep_architecture(key, arch)
    return arch


#: Bump when what `_built_architecture` returns for the same config changes.
ARCHITECTURE_CACHE_VERSION = 1


def _architecture_key(config_json: Path) -> str:
    """What the tensor list depends on: the config's bytes and the two libraries' versions."""
    import importlib.metadata as md

    digest = hashlib.sha256(config_json.read_bytes()).hexdigest()
    versions = [md.version(name) for name in ("transformers", "torch")]
    return sha256_json([ARCHITECTURE_CACHE_VERSION, digest, *versions])[:32]


def _architecture_file(key: str) -> Path:
    return user_cache_dir() / "architectures" / f"{key}.json"


def _read_architecture(key: str) -> Architecture | None:
    try:
        data = json.loads(_architecture_file(key).read_text(encoding="utf-8"))
        return Architecture(
            name=str(data["name"]),
            shapes={str(name): tuple(int(d) for d in dims) for name, dims in data["shapes"]},
            aliases={str(k): str(v) for k, v in data["aliases"].items()},
            ignore_missing=tuple(re.compile(p) for p in data["ignore_missing"]),
            ignore_unexpected=tuple(re.compile(p) for p in data["ignore_unexpected"]),
        )
    except (OSError, ValueError, TypeError, KeyError, AttributeError, re.error):
        return None


def _keep_architecture(key: str, arch: Architecture) -> None:
    if arch.to_saved is not None or arch.module_shapes:
        return
    data = {
        "name": arch.name,
        "shapes": [[name, list(dims)] for name, dims in arch.shapes.items()],
        "aliases": arch.aliases,
        "ignore_missing": [p.pattern for p in arch.ignore_missing],
        "ignore_unexpected": [p.pattern for p in arch.ignore_unexpected],
    }
    with contextlib.suppress(OSError):  # a read-only home: build it again next time
        write_json(_architecture_file(key), data)


def _built_architecture(config_dir: Path, source: Path, origin: Path) -> Architecture:
    """`expected_tensors`, built by transformers."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(config_dir)
    except (ValueError, OSError, KeyError) as exc:
        raise checkpoint_error(
            source, origin, f"not a usable model config ({_first_line(exc)})"
        ) from None
    arch_names = list(getattr(config, "architectures", None) or [])
    cls = next((getattr(transformers, a) for a in arch_names if hasattr(transformers, a)), None)
    try:
        with torch.device("meta"):
            model = cls(config) if cls is not None else AutoModelForCausalLM.from_config(config)
    except (ValueError, TypeError) as exc:
        raise checkpoint_error(
            source,
            origin,
            f"transformers {transformers.__version__} cannot build this model ({_first_line(exc)})",
        ) from None
    module_state = model.state_dict()
    to_saved: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]] | None
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:
        state = module_state
        to_saved = None
    else:
        state = revert_weight_conversion(model, dict(module_state))

        def revert(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return dict(revert_weight_conversion(model, tensors))

        to_saved = revert

    shapes = {name: tuple(int(d) for d in t.shape) for name, t in state.items()}
    module_shapes = {name: tuple(int(d) for d in t.shape) for name, t in module_state.items()}
    if module_shapes == shapes:
        module_shapes, to_saved = {}, None
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    aliases = {
        alias: names[0]
        for names in groups.values()
        for alias in names[1:]
        if alias in shapes and names[0] in shapes
    }

    def patterns(attr: str) -> tuple[re.Pattern[str], ...]:
        return tuple(re.compile(p) for p in (getattr(model, attr, None) or ()))

    return Architecture(
        name=type(model).__name__,
        shapes=shapes,
        aliases=aliases,
        ignore_missing=patterns("_keys_to_ignore_on_load_missing"),
        ignore_unexpected=patterns("_keys_to_ignore_on_load_unexpected"),
        module_shapes=module_shapes,
        to_saved=to_saved,
    )


def strip_wrappers(name: str) -> str:
    """Drop module-wrapper segments (torch.compile, FSDP1, activation checkpointing) from a name."""
    return ".".join(part for part in name.split(".") if part not in WRAPPER_SEGMENTS)


def choose_prefix(names: Iterable[str], expected: Iterable[str]) -> str | None:
    """The leading prefix under which most names are expected tensor names (shortest on ties).

    `{"model": sd, "optim": ...}` saved through DCP gives `model.model.layers.0...` and
    `optim.state.model.layers.0....exp_avg`: the prefix is `model.`. None when nothing fits.
    """
    wanted = set(expected)
    counts: Counter[str] = Counter()
    for name in names:
        parts = name.split(".")
        for depth in range(min(len(parts) - 1, MAX_PREFIX_DEPTH) + 1):
            prefix = "".join(p + "." for p in parts[:depth])
            if name[len(prefix) :] in wanted:
                counts[prefix] += 1
    if not counts:
        return None
    best = max(counts.values())
    return min((p for p, c in counts.items() if c == best), key=lambda p: (len(p), p))


@dataclass(frozen=True)
class _Match:
    """Checkpoint names matched against one set of expected names (HF name -> checkpoint name)."""

    prefix: str
    mapped: dict[str, str]
    missing: list[str]
    unexpected: list[str]
    ignored: int

    @property
    def exact(self) -> bool:
        return not self.missing and not self.unexpected


def _match(
    normalized: dict[str, str], shapes: dict[str, tuple[int, ...]], arch: Architecture
) -> _Match | None:
    prefix = choose_prefix(normalized, shapes)
    if prefix is None:
        return None
    mapped: dict[str, str] = {}
    unexpected: list[str] = []
    ignored = 0
    for norm, original in normalized.items():
        if not norm.startswith(prefix):
            ignored += 1
            continue
        hf_name = norm[len(prefix) :]
        if hf_name in shapes:
            mapped[hf_name] = original
        elif any(p.search(hf_name) for p in arch.ignore_unexpected):
            ignored += 1
        else:
            unexpected.append(original)
    for alias, canonical in arch.aliases.items():
        if canonical not in mapped and alias in mapped:
            mapped[canonical] = mapped.pop(alias)
    missing = [
        name
        for name in shapes
        if name not in mapped
        and name not in arch.aliases
        and not any(p.search(name) for p in arch.ignore_missing)
    ]
    return _Match(prefix, mapped, missing, unexpected, ignored)


def plan_tensors(ckpt: SourceCheckpoint, arch: Architecture, out_dtype: torch.dtype) -> TensorPlan:
    """Map checkpoint names onto the architecture; missing/unexpected/mis-shaped -> `UserError`.

    A raw state dict in transformers' in-memory layout (see `Architecture.module_shapes`) is
    converted to the on-disk layout, which needs the whole model in memory.
    """
    normalized: dict[str, str] = {}
    for name in ckpt.tensors:
        normalized.setdefault(strip_wrappers(name), name)
    match = _match(normalized, arch.shapes, arch)
    if arch.module_shapes and (match is None or not match.exact):
        in_memory_layout = _match(normalized, arch.module_shapes, arch)
        if in_memory_layout is not None and in_memory_layout.exact:
            return _converted_plan(ckpt, arch, in_memory_layout, out_dtype)
    if match is None:
        sample = ", ".join(list(ckpt.tensors)[:3]) or "none"
        raise checkpoint_error(
            ckpt.path,
            ckpt.label,
            f"no tensor name fits {arch.name} from config.json (first names: {sample}); "
            "wrong config.json or base_model?",
        )
    problems = []
    if match.missing:
        problems.append(
            f"{len(match.missing)} tensor(s) missing that {arch.name} expects: "
            f"{_listing(match.missing)}"
        )
    if match.unexpected:
        problems.append(
            f"{len(match.unexpected)} unexpected tensor(s) {arch.name} has no place for: "
            f"{_listing(match.unexpected)}"
        )
    if problems:
        raise checkpoint_error(ckpt.path, ckpt.label, "; ".join(problems) + " (vs config.json)")
    _check_shapes(ckpt, arch, match, arch.shapes)
    tied = {a: ckpt.tensors[match.mapped[a]] for a in arch.aliases if a in match.mapped}
    tensors = []
    for name in arch.shapes:
        if name in match.mapped and name not in tied:
            ref = ckpt.tensors[match.mapped[name]]
            tensors.append(Planned(name, ref, _out_dtype(ref, out_dtype)))
    return TensorPlan(tensors=tensors, prefix=match.prefix, ignored=match.ignored, tied=tied)


def _check_shapes(
    ckpt: SourceCheckpoint, arch: Architecture, match: _Match, shapes: dict[str, tuple[int, ...]]
) -> None:
    for hf_name, original in match.mapped.items():
        ref = ckpt.tensors[original]
        if ref.shape != shapes[hf_name]:
            raise checkpoint_error(
                ckpt.path,
                ref.file,
                f"shape mismatch: tensor {original} is {list(ref.shape)}, config.json's "
                f"{arch.name} expects {list(shapes[hf_name])}",
            )


def _converted_plan(
    ckpt: SourceCheckpoint, arch: Architecture, match: _Match, out_dtype: torch.dtype
) -> TensorPlan:
    """Load a state dict in transformers' in-memory layout and convert it to the on-disk one."""
    assert arch.to_saved is not None
    _check_shapes(ckpt, arch, match, arch.module_shapes)
    tied = {a: ckpt.tensors[match.mapped[a]] for a in arch.aliases if a in match.mapped}
    loaded = {
        name: ckpt.tensors[original].read()
        for name, original in match.mapped.items()
        if name not in tied
    }
    saved = arch.to_saved(loaded)
    wanted = [n for n in arch.shapes if n not in arch.aliases or n in saved]
    if sorted(saved) != sorted(wanted) or any(
        tuple(saved[n].shape) != arch.shapes[n] for n in wanted
    ):
        raise RuntimeError(f"transformers' weight conversion of {arch.name} gave unexpected names")
    label = ckpt.path / ckpt.label if ckpt.path.is_dir() else ckpt.path
    tensors = []
    for name in wanted:
        ref = TensorRef(
            name=name,
            shape=tuple(saved[name].shape),
            dtype=saved[name].dtype,
            file=label,
            read=in_memory(saved[name]),
        )
        tensors.append(Planned(name, ref, _out_dtype(ref, out_dtype)))
    ckpt.notes.append(
        f"converted {len(loaded)} tensors from transformers' in-memory layout to {len(saved)} "
        "on-disk tensors"
    )
    return TensorPlan(tensors=tensors, prefix=match.prefix, ignored=match.ignored, tied=tied)


def _out_dtype(ref: TensorRef, out_dtype: torch.dtype) -> torch.dtype:
    """Floating-point tensors take the output dtype; integer, bool and float8 keep theirs."""
    return out_dtype if str(ref.dtype).removeprefix("torch.") in FLOAT_DTYPES else ref.dtype


def check_tied(ckpt: SourceCheckpoint, arch: Architecture, plan: TensorPlan) -> None:
    """A tied weight stored under both names must hold the same values under both.

    Otherwise the checkpoint was trained untied while config.json says tied: loading it would
    silently use one of the two and score a different model.
    """
    import torch

    by_name = {p.name: p for p in plan.tensors}
    for alias, alias_ref in plan.tied.items():
        canonical = by_name[arch.aliases[alias]]
        if not torch.equal(
            alias_ref.read().to(canonical.dtype), canonical.ref.read().to(canonical.dtype)
        ):
            raise checkpoint_error(
                ckpt.path,
                alias_ref.file,
                f"tensor {alias_ref.name} differs from {canonical.ref.name}, but config.json ties "
                "them (tie_word_embeddings): set it to false or fix the checkpoint",
            )


def _listing(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ---- weights ----------------------------------------------------------------------------------


def write_weights(
    ckpt: SourceCheckpoint, plan: TensorPlan, staging: Path, max_shard_bytes: int
) -> list[dict[str, Any]]:
    """Link the source's safetensors files when they are exactly the output; else write shards."""
    linkable = _linkable_files(ckpt, plan)
    if linkable is not None:
        return _link_files(linkable, staging)
    shards: list[list[tuple[str, TensorRef, Any]]] = [[]]
    size = 0
    for item in plan.tensors:
        nbytes = item.ref.numel * item.dtype.itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((item.name, item.ref, item.dtype))
        size += nbytes
    if len(shards) == 1:
        names = [SINGLE_NAME]
    else:
        names = [
            f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)
        ]
    records = []
    total = 0
    for name, shard in zip(names, shards, strict=True):
        log.info("writing %s (%d tensors)", name, len(shard))
        total += write_file(staging / name, shard)
        records.append(_record(staging / name, "written", None))
    if len(shards) > 1:
        weight_map = {t[0]: name for name, shard in zip(names, shards, strict=True) for t in shard}
        records.append(_write_index(staging, weight_map, total))
    return records


def _linkable_files(ckpt: SourceCheckpoint, plan: TensorPlan) -> list[Path] | None:
    """The source files, if the output is exactly their tensors under the same names and dtypes."""
    files: dict[Path, set[str]] = {}
    for item in plan.tensors:
        ref = item.ref
        if ref.byte_range is None or ref.file.suffix != ".safetensors":
            return None
        if ref.dtype != item.dtype or ref.name != item.name:
            return None
        files.setdefault(ref.file, set()).add(ref.name)
    for file, names in files.items():
        if {r.name for r in ckpt.tensors.values() if r.file == file} != names:
            return None
    return sorted(files)


def _link_files(files: list[Path], staging: Path) -> list[dict[str, Any]]:
    records = []
    targets = {files[0]: SINGLE_NAME} if len(files) == 1 else {f: f.name for f in files}
    for src, name in targets.items():
        how = _link(src, staging / name)
        records.append(_record(staging / name, how, src))
    if len(files) > 1:
        weight_map = {}
        total = 0
        for src, name in targets.items():
            for tensor, entry in read_header(src, src.parent).items():
                weight_map[tensor] = name
                total += entry.end - entry.start
        records.append(_write_index(staging, weight_map, total))
    log.info("linked %d weight file(s) from the source", len(files))
    return records


def _link(src: Path, dst: Path) -> str:
    """Hard-link (no copy, survives the trainer deleting the source), else symlink."""
    try:
        os.link(src, dst)
        return "hardlink"
    except OSError:
        os.symlink(os.path.realpath(src), dst)
        return "symlink"


def _write_index(staging: Path, weight_map: dict[str, str], total: int) -> dict[str, Any]:
    _write_json(staging / INDEX_NAME, {"metadata": {"total_size": total}, "weight_map": weight_map})
    return _record(staging / INDEX_NAME, "written", None)


# ---- smoke generation -------------------------------------------------------------------------


def smoke_check(
    model_dir: Path, engine: str, dtype: str, engine_args: dict[str, Any], source: Path
) -> dict[str, Any]:
    """Generate `SMOKE_TOKENS` greedy tokens; NaN/inf logits or empty output -> `UserError`."""
    if engine == "none":
        return {"engine": "none", "prompt": None, "text": None, "token_ids": None}
    started = time.monotonic()
    if engine == "vllm":
        base = {"dtype": dtype, "seed": SMOKE_SEED, "max_model_len": smoke_context(model_dir)}
        result = _smoke_vllm_subprocess(model_dir, {**base, **engine_args}, source)
    else:
        result = smoke_transformers(model_dir, dtype)
    seconds = round(time.monotonic() - started, 3)
    log.info("smoke (%s, %.1f s): %r -> %r", engine, seconds, SMOKE_PROMPT, result["text"])
    if not result["finite"]:
        raise checkpoint_error(
            source,
            None,
            f"smoke generation ({engine}) produced NaN/inf logits: the weights are broken",
        )
    if not result["token_ids"] or not result["text"]:
        raise checkpoint_error(
            source,
            None,
            f"smoke generation ({engine}) produced no text for {SMOKE_PROMPT!r} "
            f"(token ids {result['token_ids']})",
        )
    return {
        "engine": engine,
        "prompt": SMOKE_PROMPT,
        "text": result["text"],
        "token_ids": result["token_ids"],
        "seconds": seconds,
        # Which CPU kernels vLLM computed the smoke with (ckpteval.engine.cpu_kernels).
        **({"cpu_kernels": result["cpu_kernels"]} if result.get("cpu_kernels") else {}),
    }


def smoke_context(model_dir: Path) -> int:
    """The vLLM smoke test's `max_model_len`: `SMOKE_MAX_MODEL_LEN`, or the model's own maximum
    (`max_position_embeddings` of its config.json) when that is smaller. The workflow's
    `engine.max_model_len` is a setting of generations, not of the model, and is not read."""
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return SMOKE_MAX_MODEL_LEN
    limit = config.get("max_position_embeddings") if isinstance(config, dict) else None
    if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
        return min(SMOKE_MAX_MODEL_LEN, limit)
    return SMOKE_MAX_MODEL_LEN


def smoke_transformers(model_dir: Path, dtype: str) -> dict[str, Any]:
    """Greedy generation with transformers on CPU: `{text, token_ids, finite}`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    inputs = tokenizer(SMOKE_PROMPT, return_tensors="pt")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.no_grad():
        out = model.generate(
            **inputs,
            max_new_tokens=SMOKE_TOKENS,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=pad,
        )
    token_ids = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    finite = all(bool(torch.isfinite(step).all()) for step in out.logits)
    text = tokenizer.decode(token_ids, skip_special_tokens=True)
    return {"text": text, "token_ids": token_ids, "finite": finite}


def _smoke_vllm_subprocess(
    model_dir: Path, engine_args: dict[str, Any], source: Path
) -> dict[str, Any]:
    """Run the vLLM smoke generation in a child process: its exit is the engine's teardown."""
    env = {**os.environ}
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    with tempfile.TemporaryDirectory(prefix="ckpteval-smoke-") as tmp:
        request = Path(tmp) / "request.json"
        result = Path(tmp) / "result.json"
        request.write_text(json.dumps({"model": str(model_dir), "engine_args": engine_args}))
        cmd = [
            sys.executable,
            "-m",
            "ckpteval.consolidate",
            "smoke-vllm",
            str(request),
            str(result),
        ]
        proc = subprocess.run(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        sys.stderr.write(proc.stdout)
        sys.stderr.flush()
        if proc.returncode != 0 or not result.exists():
            lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
            last = lines[-1].strip() if lines else f"exit code {proc.returncode}"
            raise checkpoint_error(
                source, None, f"vLLM could not load or run the consolidated model: {last}"
            )
        return json.loads(result.read_text())


def smoke_vllm(model_dir: str, engine_args: dict[str, Any]) -> dict[str, Any]:
    """Greedy generation with `vllm.LLM` (call in a fresh process): `{text, token_ids, finite,
    cpu_kernels}` (on the CPU backend: layers per linear kernel and vLLM's native library).

    `engine_args` may be the workflow's whole engine config: keys that `vllm.EngineArgs` does not
    know (ckpteval's own settings) are left out.
    """
    import dataclasses

    from ckpteval.engine.heap import engine_imports

    with engine_imports():
        from vllm import LLM, EngineArgs, SamplingParams

    known = {f.name for f in dataclasses.fields(EngineArgs)}
    kwargs = {k: v for k, v in engine_args.items() if k in known and k != "model"}
    skipped = sorted(set(engine_args) - set(kwargs))
    if skipped:
        log.info("not vLLM engine arguments, left out: %s", ", ".join(skipped))
    from vllm.platforms import current_platform

    on_cpu = current_platform.is_cpu()
    if on_cpu:
        from ckpteval.engine.cpu_kernels import (
            apply_cpu_kernels,
            cpu_linear_kinds,
            describe,
            vllm_library,
        )

        plan = apply_cpu_kernels()
        if "kv_cache_memory_bytes" not in kwargs:
            from ckpteval.engine.kvcache import cpu_engine_args

            kwargs.update(cpu_engine_args(model_dir, kwargs.get("max_model_len") or 4096))
    llm = LLM(model=model_dir, **kwargs)
    kernels: dict[str, Any] = {}
    if on_cpu:
        kernels = {"linear": llm.collective_rpc(cpu_linear_kinds)[0], "library": vllm_library()}
        log.info("CPU linear kernels: %s", describe(kernels["linear"], plan, kernels["library"]))
    params = SamplingParams(temperature=0.0, max_tokens=SMOKE_TOKENS, logprobs=1, seed=SMOKE_SEED)
    output = llm.generate([SMOKE_PROMPT], params, use_tqdm=False)[0].outputs[0]
    token_ids = list(output.token_ids)
    logprobs = [
        step[tok].logprob
        for step, tok in zip(output.logprobs or [], token_ids, strict=False)
        if step is not None
    ]
    finite = all(math.isfinite(lp) for lp in logprobs) and (
        output.cumulative_logprob is None or math.isfinite(output.cumulative_logprob)
    )
    return {"text": output.text, "token_ids": token_ids, "finite": finite, "cpu_kernels": kernels}


# ---- atomic publication -----------------------------------------------------------------------


def _new_staging(out_dir: Path) -> Path:
    """A fresh `.{name}.tmp-*` beside `out_dir`, after removing ones a killed job left behind."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    for stale in list(out_dir.parent.glob(f".{out_dir.name}.tmp-*")) + list(
        out_dir.parent.glob(f".{out_dir.name}.old-*")
    ):
        shutil.rmtree(stale, ignore_errors=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    staging.chmod(0o755)
    return staging


def _publish(staging: Path, out_dir: Path, manifest_path: Path) -> None:
    """Rename `staging` to `out_dir`; an old `out_dir` is moved aside first, then deleted.

    The old manifest goes first, so a manifest never describes a directory it was not written for.
    """
    manifest_path.unlink(missing_ok=True)
    if out_dir.is_symlink() or out_dir.is_file():
        out_dir.unlink()
    if out_dir.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.rename(out_dir, old / out_dir.name)
        os.rename(staging, out_dir)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(staging, out_dir)
    fd = os.open(out_dir.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _main(argv: list[str] | None = None) -> int:
    """`python -m ckpteval.consolidate smoke-vllm REQUEST.json RESULT.json`, for `smoke_check`."""
    parser = argparse.ArgumentParser(prog="python -m ckpteval.consolidate")
    parser.add_argument("command", choices=["smoke-vllm"])
    parser.add_argument("request", type=Path)
    parser.add_argument("result", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    request = json.loads(args.request.read_text())
    try:
        result = smoke_vllm(request["model"], request["engine_args"])
    except UserError as exc:  # one line, which the parent quotes
        print(f"error: {exc}", flush=True)
        return 2
    write_json(args.result, result)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
