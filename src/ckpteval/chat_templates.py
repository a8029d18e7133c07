"""Which chat template a run's prompts go through (`runs.<name>.chat_template`), and the record of it.

A task asks for chat formatting (`tasks.<name>.chat_template: true`); the run says with which
template:

| value | prompts of a task that asks | meta `chat_template.source` |
| --- | --- | --- |
| `auto` (default) | the checkpoint's own tokenizer template; plain if it has none | `checkpoint`, or `none (checkpoint has no template)` |
| `none` | plain, whatever the task asks | `none` |
| a `.jinja` file | that template | `file:<absolute path>` |
| a known name | the template shipped in `ckpteval/data/chat_templates/<name>.jinja` | `builtin:<name>` |

A task that does not ask is plain in every case (`none`). Every generation meta records the
source and the sha256 of the template text used (null when plain), the evaluate step copies it
into the score cell, and the aggregate step flags a comparison of cells whose templates differ.

A file or a known name enters the identity of the run's chat-asking cells by the template's
CONTENT (`ChatTemplate.identity`): moving the file reruns nothing, editing it reruns those cells.
`auto` adds nothing: the checkpoint's template is part of its content identity (its files), so a
new template in a checkpoint reruns its chain like any new bytes. Endpoint runs (`openai`) take
`auto` (the server applies its own template) or `none` only.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpteval.errors import UserError
from ckpteval.plan.layout import Layout

BUILTIN_DIR = Path(__file__).resolve().parent / "data" / "chat_templates"
#: The record of plain prompts.
PLAIN = {"source": "none", "sha256": None}
NO_TEMPLATE = "none (checkpoint has no template)"


def builtin_names() -> list[str]:
    """The known template names (`<name>.jinja` files shipped with the package)."""
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.jinja"))


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class ChatTemplate:
    """A run's resolved `chat_template`: `mode` auto|none|file|builtin; `text` for file/builtin;
    `label` the absolute path or the name."""

    mode: str = "auto"
    text: str | None = field(default=None, repr=False)
    label: str = ""

    @property
    def sha256(self) -> str | None:
        return text_sha256(self.text) if self.text is not None else None

    @property
    def identity(self) -> str | None:
        """What the run's chat-asking cells' identity records: None for auto (nothing: an unset
        key changes no identity), `none`, or the template's content hash (not its path)."""
        if self.mode == "auto":
            return None
        if self.mode == "none":
            return "none"
        return f"sha256:{str(self.sha256)[:16]}"

    @property
    def source(self) -> str:
        return {"file": f"file:{self.label}", "builtin": f"builtin:{self.label}"}.get(
            self.mode, self.mode
        )


def resolve(value: str | None, *, key: str, base_dir: Path, backend: str = "vllm") -> ChatTemplate:
    """A run's `chat_template` value resolved, or a one-line `UserError` naming `key` (e.g.
    `config: runs.x.chat_template`). A value ending in `.jinja` or holding a `/` is a file
    (relative to `base_dir`); any other is a known name."""
    value = value or "auto"
    if value in ("auto", "none"):
        return ChatTemplate(value)
    known = ", ".join(builtin_names())
    if backend != "vllm":
        raise UserError(
            f"{key}: {value!r}: a template file or name applies to vllm runs only (this "
            f"run's backend, {backend}, formats its prompts elsewhere); use auto or none"
        )
    if value.endswith(".jinja") or "/" in value or os.sep in value:
        path = Path(os.path.expanduser(os.path.expandvars(value)))
        path = path if path.is_absolute() else base_dir / path
        if not path.is_file():
            raise UserError(
                f"{key}: no template file {path}; give a .jinja file, a known name ({known}), "
                "auto or none"
            )
        mode, label, text = "file", str(path.resolve()), path.read_text(encoding="utf-8")
    elif value in builtin_names():
        mode, label, text = "builtin", value, (BUILTIN_DIR / f"{value}.jinja").read_text("utf-8")
    else:
        raise UserError(
            f"{key}: {value!r} is neither a known template ({known}) nor a .jinja file; "
            "or use auto or none"
        )
    _check_syntax(text, key, label)
    return ChatTemplate(mode, text, label)


def _check_syntax(text: str, key: str, label: str) -> None:
    import jinja2

    if not text.strip():
        raise UserError(f"{key}: template {label} is empty")
    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise UserError(
            f"{key}: template {label} is not valid Jinja (line {exc.lineno}: {exc.message})"
        ) from None


# ---- the checkpoint's own template, at parse time


def has_template(model_dir: Path) -> bool:
    """`consolidate.has_chat_template` at parse time, where a checkpoint may still be being
    written: an unreadable tokenizer_config.json counts as no template, not as an error."""
    from ckpteval.consolidate import has_chat_template

    try:
        return has_chat_template(model_dir)
    except (OSError, UserError):
        return False


def checkpoint_has_template(
    ckpt: Any, fmt: str, base_model: Path | None, consolidated: Path
) -> bool:
    """Whether a checkpoint's model has a chat template, read where generation reads it: the
    consolidated directory (what the engine loads) when it exists; before that, the one
    consolidation will copy (`consolidate.template_origin` of the format's side-file directory,
    verl's `actor/huggingface/`, and the base model). A checkpoint on S3 not yet downloaded
    counts as having one when its listing holds tokenizer files: what they hold is known only
    once downloaded, and a parse downloads nothing."""
    from ckpteval.consolidate import template_origin
    from ckpteval.formats import side_dir

    if (consolidated / "config.json").is_file():
        return has_template(consolidated)
    if _on_s3_with_tokenizer(ckpt):
        return True
    try:
        return template_origin(side_dir(ckpt.path, fmt), base_model) is not None
    except (OSError, UserError):
        return False


def missing_template_lines(plan: Any) -> list[str]:
    """One line per `auto` vllm run whose checkpoints (some or all) lack a chat template while
    tasks ask for one (base and RL-zero checkpoints): those prompts will be plain."""
    asking = [n for n, t in plan.tasks.items() if t.options.get("chat_template")]
    if not asking:
        return []
    lines = []
    for run in plan.runs.values():
        if not run.has_weights or run.chat_template.mode != "auto":
            continue
        models = Path(Layout(plan.outdir).models_of(run.name))
        lacking = [
            c.name
            for c in run.checkpoints
            if not checkpoint_has_template(c, run.format, run.base_model, models / c.name)
        ]
        if not lacking:
            continue
        shown = ", ".join(lacking[:3]) + (
            f", ... ({len(lacking)} in all)" if len(lacking) > 3 else ""
        )
        lines.append(
            f"run {run.name}: checkpoint(s) {shown} have no chat template but task(s) "
            f"{', '.join(asking)} ask for one: their prompts are plain (recorded as such); set "
            f"runs.{run.name}.chat_template to a .jinja file or a known template "
            f"({', '.join(builtin_names())}), or to none"
        )
    return lines


def _on_s3_with_tokenizer(ckpt: Any) -> bool:
    """A checkpoint on S3 whose listing holds tokenizer files or a template file."""
    names = {o.rel.rsplit("/", 1)[-1] for o in ckpt.objects} if ckpt.url else set()
    return bool(names & {"tokenizer_config.json", "chat_template.jinja", "chat_template.json"})


def check_plain_turns(runs: dict[str, Any], tasks: dict[str, Any]) -> None:
    """One line at parse time when a run whose prompts are plain (`chat_template: none`) meets
    a task whose rows have earlier turns (few-shot chat messages): plain text has no rendering
    of turns that a model was trained on, so they are refused rather than dropped. (An `auto`
    run whose checkpoint turns out to have no template is refused by its infer job.)"""
    from ckpteval.problems import earlier_turns

    plain = [
        r.name for r in runs.values() if r.chat_template.mode == "none" and r.backend != "replay"
    ]
    if not plain:
        return
    for task in tasks.values():
        if task.custom is None or not task.options.get("chat_template"):
            continue
        multi = next((p for p in task.builtin.load() if earlier_turns(p)), None)
        if multi is not None:
            raise UserError(
                f"config: runs.{plain[0]}.chat_template: none, but task {task.name}'s problem "
                f"{multi['task_id']} has {len(multi['messages'])} chat messages, which need a "
                "chat template; use auto, a .jinja file or a known name"
            )


# ---- at run time


@dataclass(frozen=True)
class TemplateUse:
    """How one job's prompts are formatted: `chat` through a template (`text`; None: the
    tokenizer's own) or plain; `record` is what its meta records (`{source, sha256}`)."""

    chat: bool
    text: str | None = field(default=None, repr=False)
    record: dict[str, Any] = field(default_factory=lambda: dict(PLAIN), compare=False)


def template_use(choice: ChatTemplate, asked: bool, backend: Any) -> TemplateUse:
    """The template a job of a task that `asked` (or not) for chat formatting uses on `backend`
    (the checkpoint's own template is read from its tokenizer: no engine is loaded)."""
    if not asked or choice.mode == "none":
        return TemplateUse(False)
    if choice.mode in ("file", "builtin"):
        return TemplateUse(True, choice.text, {"source": choice.source, "sha256": choice.sha256})
    tokenizer = getattr(backend, "tokenizer", None)
    if tokenizer is None:  # an endpoint applies its own template to the chat messages
        return TemplateUse(True, None, {"source": "endpoint", "sha256": None})
    own = tokenizer.chat_template
    if isinstance(own, dict):  # named templates: transformers uses "default"
        own = own.get("default")
    if not own:
        return TemplateUse(False, None, {"source": NO_TEMPLATE, "sha256": None})
    return TemplateUse(True, None, {"source": "checkpoint", "sha256": text_sha256(str(own))})
