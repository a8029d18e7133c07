"""verl LoRA actors: the adapter in verl's rank shards, folded into the model vLLM loads.

verl's FSDP engine wraps the model with peft (`get_peft_model` with `r`, `lora_alpha`,
`target_modules`, no bias) before sharding, so each rank's `model.state_dict()` holds peft's
names: `base_model.model.<module>.base_layer.weight` for an adapted layer's frozen weight,
`base_model.model.<module>.lora_A.default.weight` / `lora_B` for the adapter and
`base_model.model.<name>` for everything else (with `checkpoint.save_lora_only`, the adapter
alone). The adapter's scale `lora_alpha / r` is not in the shards: rank 0 writes it to
`actor/lora_train_meta.json` (`r`, `lora_alpha`, `task_type`). verl's `model_merger` splits the
merged state dict into the base model and a peft adapter (`lora_adapter/`) and leaves the fold to
the user; without that file it writes `lora_alpha: 0` with a warning, an adapter that scales to
nothing. Here that file is required.

The fold is peft's `merge_and_unload`, shared with the `lora` format (`lora.fold`), on the model
rebuilt as verl's merger and peft would leave it: every tensor cast to the output dtype (verl's
merger writes bfloat16), the adapter then held in the dtype peft gives it when it loads an adapter
(float32 for a bfloat16 base). The model is built on the meta device and the tensors are
assigned to it, so the fold holds one copy of the model, not two.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from ckpteval.formats.base import SourceCheckpoint, checkpoint_error
from ckpteval.formats.lora import fold

LORA_META = "lora_train_meta.json"
META_KEYS = ("r", "lora_alpha", "task_type")
PREFIX = "base_model.model."
ADAPTER_RE = re.compile(r"base_model\.model\.(.+)\.lora_([AB])\.default\.weight\Z")


def has_lora(names: list[str]) -> bool:
    """Whether a verl shard's tensors include a LoRA adapter (verl's own test: "lora_")."""
    return any("lora_" in name for name in names)


def read_meta(path: Path, actor: Path) -> dict[str, Any]:
    """`lora_train_meta.json`, checked: a positive `r` and `lora_alpha`, nothing else unknown."""
    file = actor / LORA_META
    try:
        meta = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise checkpoint_error(
            path,
            file,
            "missing: the rank shards hold a LoRA adapter whose scale (lora_alpha / r) verl "
            'records only there; write {"r": R, "lora_alpha": ALPHA} with the training run\'s values',
        ) from None
    except (OSError, ValueError) as exc:
        raise checkpoint_error(path, file, f"unreadable ({str(exc).splitlines()[0]})") from None
    if not isinstance(meta, dict):
        raise checkpoint_error(path, file, f"holds {type(meta).__name__}, not a JSON object")
    unknown = sorted(set(meta) - set(META_KEYS))
    if unknown:
        raise checkpoint_error(
            path,
            file,
            f"has {', '.join(unknown)}, which ckpteval does not fold (it reads r, "
            "lora_alpha, task_type, all verl writes)",
        )
    for key in ("r", "lora_alpha"):
        value = meta.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise checkpoint_error(
                path,
                file,
                f"{key} is {value!r}: a positive number is needed (lora_alpha 0 or missing would "
                "scale the adapter to nothing); write the training run's value",
            )
    if int(meta["r"]) != meta["r"]:
        raise checkpoint_error(path, file, f"r is {meta['r']!r}: the LoRA rank is an integer")
    if not isinstance(meta.get("task_type", ""), str | None):
        raise checkpoint_error(path, file, f"task_type is {meta['task_type']!r}, not a string")
    return meta


def _adapted_modules(path: Path, file: Path, names: list[str]) -> list[str]:
    """The modules an adapter covers, from the `lora_A`/`lora_B` names; anything else with
    `lora_` in its name (an embedding adapter, DoRA magnitudes, a second adapter) is refused."""
    modules: dict[str, set[str]] = {}
    for name in names:
        if "lora_" not in name:
            continue
        match = ADAPTER_RE.match(name)
        if match is None:
            raise checkpoint_error(
                path,
                file,
                f"tensor {name}: a LoRA tensor ckpteval does not fold (it folds "
                "<module>.lora_A/lora_B.default.weight of linear layers)",
            )
        modules.setdefault(match.group(1), set()).add(match.group(2))
    for module, halves in modules.items():
        if halves != {"A", "B"}:
            raise checkpoint_error(path, file, f"{module} has lora_{halves.pop()} alone")
    return sorted(modules)


def _model(meta_dir: Path | None, base: Path | None, dtype: Any) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if base is not None:  # the adapter alone: the base weights come from base_model
        return AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    config = AutoConfig.from_pretrained(meta_dir)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def _retie(model: Any) -> None:
    """`assign` gives a tied `lm_head` its own copy of the embedding; peft's merge would then
    mark the config untied. Tie them again when they are equal (when they are not, the shards
    contradict the config and consolidation's tied-embedding check names it)."""
    import torch

    out, inp = model.get_output_embeddings(), model.get_input_embeddings()
    tied = getattr(model.config.get_text_config(), "tie_word_embeddings", False)
    if not tied or out is None or inp is None or out.weight is inp.weight:
        return
    if out.weight.shape == inp.weight.shape and torch.equal(out.weight, inp.weight):
        out.weight = inp.weight


def _state(
    path: Path, file: Path, source: SourceCheckpoint, held: dict, lora_only: bool, out: Any
) -> dict[str, Any]:
    """The shards' tensors in the output dtype, then in the dtype peft holds each in (float32
    for an adapter on a 16-bit base): every one a tensor of the model, of its shape, and every
    tensor of the model there (of the adapter, with `save_lora_only`)."""
    state = {}
    for name, ref in source.tensors.items():
        if name not in held:
            raise checkpoint_error(path, file, f"tensor {name}: not in the model its config builds")
        if tuple(ref.shape) != tuple(held[name].shape):
            raise checkpoint_error(
                path,
                file,
                f"tensor {name}: shape {list(ref.shape)}, the model's is {list(held[name].shape)}",
            )
        state[name] = ref.read().to(out).to(held[name].dtype)
    missing = [n for n in held if n not in state and not (lora_only and "lora_" not in n)]
    if missing:
        raise checkpoint_error(
            path, file, f"has no tensor {missing[0]} (of {len(missing)} missing)"
        )
    return state


def open_lora(
    path: Path, actor: Path, source: SourceCheckpoint, base_model: Path | None, dtype: str
) -> SourceCheckpoint:
    """`source` (the merged rank shards, peft's names) with its adapter folded in."""
    import torch
    from peft import LoraConfig, get_peft_model

    file = actor / source.label
    meta = read_meta(path, actor)
    names = list(source.tensors)
    modules = _adapted_modules(path, file, names)
    lora_only = all("lora_" in name for name in names)
    if lora_only and base_model is None:
        raise checkpoint_error(
            path,
            file,
            "holds the LoRA adapter alone (verl's checkpoint.save_lora_only): set base_model "
            "for this run to the model the adapter was trained on",
        )
    if not lora_only and source.meta_dir is None:
        raise checkpoint_error(
            path, actor / "huggingface", "missing: the model's config.json is needed to fold LoRA"
        )
    if lora_only and not (base_model / "config.json").is_file():
        raise checkpoint_error(path, file, f"base model {base_model} has no config.json")
    for module in modules:
        got = source.tensors[f"{PREFIX}{module}.lora_A.default.weight"].shape[0]
        if got != meta["r"]:
            raise checkpoint_error(
                path, actor / LORA_META, f"says r={meta['r']}, but {module}'s lora_A has rank {got}"
            )
    config = LoraConfig(
        r=int(meta["r"]),
        lora_alpha=meta["lora_alpha"],
        target_modules=modules,  # full names: exactly the modules verl adapted
        task_type=meta.get("task_type") or "CAUSAL_LM",
        bias="none",
    )
    out = getattr(torch, dtype)
    base = _model(source.meta_dir, base_model if lora_only else None, out)
    peft_model = get_peft_model(base, config)
    state = _state(path, file, source, peft_model.state_dict(), lora_only, out)
    peft_model.load_state_dict(state, strict=False, assign=True)
    _retie(peft_model.get_base_model())
    tensors, folded = fold(peft_model, file)
    notes = [*source.notes, f"folded the {folded} in (r and lora_alpha from {LORA_META})"]
    return SourceCheckpoint(
        path=path,
        tensors=tensors,
        label=source.label,
        meta_dir=source.meta_dir,
        base_dir=base_model if lora_only else None,
        non_tensors=source.non_tensors,
        notes=notes,
    )
