"""Prompt texts and the template renderer of the built-in tasks and checkers.

A module of its own, below both `tasks` and `checkers`: the checkers' default prompts (python,
stdio, math) and the task registry use the same texts, and neither needs to import the other
for them.
"""

from __future__ import annotations

from typing import Any

from ckpteval.errors import UserError

#: Where a python completion ends: the next top-level statement or the closing fence.
PYTHON_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```")

#: The default prompt of stdin/stdout tasks: the statement, then an open code block of the
#: task's language that the model fills in (the task stops at the closing fence).
STDIO_PROMPT = (
    "{question}\n\nWrite a {language_name} program that reads the input from standard "
    "input and writes the answer to standard output.\n\n```{language}\n"
)
#: MBPP-shaped python problems (`text`, `test_list`) without a `prompt` of their own.
MBPP_PROMPT = "{text}\nYour code should pass these tests:\n{tests_text}\n\n```python\n"
MATH_PROMPT = "Question: {question}\nAnswer:"

_LANGUAGE_NAMES = {"python": "Python 3", "cpp": "C++17", "rust": "Rust"}


def render_template(
    template: str, problem: dict[str, Any], language: str | None, *, where: str
) -> str:
    """`template` (str.format style) over the problem's fields, plus `language` and
    `language_name`; a field the problem lacks is a `UserError` naming the task."""
    lang = language or "python"
    # the task's language, not a problem's own `language` (its reference solution's)
    fields = {**problem, "language": lang, "language_name": _LANGUAGE_NAMES.get(lang, lang)}
    try:
        return template.format_map(fields)
    except KeyError as exc:
        raise UserError(
            f"config: tasks.{where}.prompt: problem {problem.get('task_id')!r} has "
            f"no field {exc} (it has {', '.join(sorted(problem))})"
        ) from None
    except (ValueError, IndexError, AttributeError) as exc:
        raise UserError(
            f"config: tasks.{where}.prompt: not a valid template ({exc}); write "
            "literal braces as {{ and }}"
        ) from None
