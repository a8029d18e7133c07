"""Where a math completion states its final answer (docs/evaluate.md, "Math answers").

The order, first that applies:
1. the last non-empty `\\boxed{}` (or `\\fbox{}`) of the text; a last box left open (a truncated
   completion) means no answer, not an earlier box;
2. the last answer statement, by position: an answer sentence ("The final answer is",
   "The answer is", "The correct answer is", "the answer should be"), an answer line
   (`Answer:`, `**Answer:** x`, `**Answer: x**`, `Final Answer: x`, a `Final Answer` heading
   followed by the answer on the next line), or GSM8K's marker (`#### 72`, where what follows is an
   answer, not a markdown heading such as `#### Step 1: ...` or `#### 2. Compute`);
3. only for tasks that declare it (`last_line=True`), the last line when it reads as an answer;
4. else no answer: nothing is ever taken from the working.

Reasoning tasks hand in only the text after the reasoning (ckpteval.reasoning), so a box inside
the reasoning is never read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BOX_BARE = re.compile(r"\\boxed[ \t]+([^\s${][^\s$]*)")
_SENTENCE = re.compile(
    r"(?i)\bthe\s+(?:final\s+|correct\s+)?answer\s+(?:is|should\s+be|would\s+be)\b\s*:?"
)
_ANSWER_LINE = re.compile(r"(?im)^[ \t>#*_-]*(?:final\s+)?answer[ \t]*(?:\*\*|__)?[ \t]*[:：]")
_ANSWER_HEADING = re.compile(r"(?im)^[ \t#*_]*final\s+answer[ \t*_:]*$")
_HASHES = re.compile(r"####[ \t]*([^\n]*)")
_NUMBERED_HEADING = re.compile(r"^\d+[.):]\s+\S")
_WORD = re.compile(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}")
_FILLERS = re.compile(r"(?i)^(?:(?:actually|clearly|simply|therefore|thus|just|then|exactly)\s+)+")
#: Where the answer in a sentence ends: a full stop, minerva's "I hope it is correct", or a clause
#: that explains it (`7, because it fits`; `12; so we are done`).
#: A run of spaces is tried from its first space only (`(?<!\s)`): from every one of its spaces,
#: 12,000 spaces took seconds.
_SENTENCE_END = re.compile(
    r"\.(?:\s|$)|(?<!\s)\s+I hope it is correct|;"
    r"|(?:,|(?<![\s,]))\s+(?:because|since|as|so|which|given|where)\b"
)
_TRAILING_CONJUNCTION = re.compile(r"\b(?:and|but|so)$")
#: A sentence that judges an answer rather than states one ("the answer is correct").
_VERDICT = re.compile(
    r"(?i)(?:correct|right|wrong|incorrect|consistent|reasonable|plausible|valid|verified|"
    r"confirmed|indeed|not|likely|probably|clear|obvious|the same|unchanged)\b"
)
_MATH_SPANS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))


def boxes(text: str) -> list[str | None]:
    """The contents of every non-empty `\\boxed{...}` / `\\fbox{...}` / `\\boxed x`, in order;
    None for one that never closes. An empty box (`put the answer in \\boxed{}`) is not one."""
    return [content for _, _, content in box_spans(text)]


def _closing_braces(text: str) -> dict[int, int]:
    """Where each `{` of `text` that closes is closed, in one pass: looking for each box's
    closing brace from the box took time quadratic in a run of unclosed boxes."""
    closing, open_at = {}, []
    for i, char in enumerate(text):
        if char == "{":
            open_at.append(i)
        elif char == "}" and open_at:
            closing[open_at.pop()] = i
    return closing


#: What may stand between boxes that state one answer together (`\\boxed{3}, \\boxed{4}`,
#: `$\\boxed{3}$ or $\\boxed{4}$`): the boxes are read as one list (all the roots, or a hedge).
_BOX_JOINER = re.compile(
    r"[\s$,;]*(?:(?:and|or|\\text\{\s*(?:and|or)\s*\}|\\quad|\\qquad)[\s$,;]*)?"
)


def _box_groups(text: str) -> list[tuple[int, int, list[str | None]]]:
    """(start, end, contents) of each group of boxes that state one answer together: boxes that
    only commas, `and`, `or` or spacing separate (`\\boxed{3}, \\boxed{4}`), in order."""
    groups: list[tuple[int, int, list[str | None]]] = []
    for start, end, content in box_spans(text):
        if groups and _BOX_JOINER.fullmatch(text, groups[-1][1], start):
            groups[-1] = (groups[-1][0], end, [*groups[-1][2], content])
        else:
            groups.append((start, end, [content]))
    return groups


def box_spans(text: str) -> list[tuple[int, int, str | None]]:
    """(start, end, content) of every non-empty box, in order; content None (and end the end of
    the text) for a box that never closes."""
    found: list[tuple[int, int, str | None]] = [
        (m.start(), m.end(), m.group(1).strip()) for m in _BOX_BARE.finditer(text)
    ]
    closing: dict[int, int] | None = None
    for match in _BOX_OPEN.finditer(text):
        closing = _closing_braces(text) if closing is None else closing
        end = closing.get(match.end() - 1)
        if end is None:
            found.append((match.start(), len(text), None))
        else:
            found.append((match.start(), end + 1, text[match.end() : end].strip()))
    return [f for f in sorted(found) if f[2] != ""]


def boxed(text: str) -> str | None:
    """Content of the last box; None if there is none or the last one is never closed."""
    found = boxes(text)
    return found[-1] if found else None


def gold_answer(problem: Mapping[str, Any]) -> str:
    """The reference answer of a problem record (`answer`, else `solution`, else `target`)."""
    raw = next(
        (str(problem[k]) for k in ("answer", "solution", "target") if problem.get(k) is not None),
        "",
    )
    if "####" in raw:
        after = raw.rsplit("####", 1)[1].strip()
        return after.splitlines()[0].strip() if after else ""
    return boxed(raw) or raw.strip()


def extract_answer(completion: str, *, last_line: bool = False) -> tuple[str | None, str | None]:
    """(answer, how it was found) of a completion; (None, None) when it states no final answer.

    `how` is `boxed`, `answer_is` (an answer sentence), `answer_line`, `####`, or `last_line`."""
    answers, how = final_answers(completion, last_line=last_line)
    return (answers[-1], how) if answers else (None, None)


#: Words by which a completion withdraws an answer it stated ("The answer is 5. Wait, I dropped a
#: term. The answer is 6."): an answer followed by one before the next is not among its finals.
_WITHDRAWN = re.compile(
    r"(?i)\b(?:wait|hmm+|oops|no|but|however|instead|rather|actually|mistakes?|mistaken|slip|"
    r"errors?|erred|wrong|incorrect|correct(?:ion|ing|ed)|fails?|failed|scratch|"
    r"(?:re-?|double[- ]?)?check(?:s|ed|ing)?|verify(?:ing)?|re-?do(?:ing)?|"
    r"re-?(?:comput|calculat|consider|examin|visit)\w*|let\s+(?:me|us)|let's)\b"
)


def final_answers(completion: str, *, last_line: bool = False) -> tuple[list[str], str | None]:
    """(the final answers a completion states, how they were found): the answer `extract_answer`
    reads, last, after the different answers stated before it in the same way (boxes, or else
    statements) that no later words withdraw (`_WITHDRAWN`), each text once; ([], None) when it
    states none. One answer is the rule; several are a completion that does not commit to one
    (round 3's "The answer is 41. The answer is 42. The answer is 43."), and each must then equal
    the gold. Linear in the completion's length whatever it repeats."""
    groups = _box_groups(completion)
    if groups:
        if None in groups[-1][2]:
            return [], None
        answers = [(start, end, ", ".join(found)) for start, end, found in groups]  # type: ignore[arg-type]
        return _unwithdrawn(completion, answers), "boxed"
    statements = sorted([*_sentences(completion), *_answer_lines(completion), *_gsm8k(completion)])
    if statements:
        found = [(start, end, answer) for start, end, answer, _ in statements]
        return _unwithdrawn(completion, found), statements[-1][3]
    if last_line:
        answer = _last_line(completion)
        if answer:
            return [answer], "last_line"
    return [], None


def _unwithdrawn(text: str, found: list[tuple[int, int, str]]) -> list[str]:
    """The last answer of `found` ((start, end, answer) in order), after the earlier ones that no
    withdrawing word follows before the next answer starts and that do not hold the next one
    (a box in a box, a sentence on an answer line), each text once (the last one last)."""
    kept: dict[str, str] = {}
    for (start, end, answer), following in zip(found, [*found[1:], None], strict=True):
        if following is not None and (
            following[0] < end  # the next one is inside it (`Final Answer: The answer is 5`)
            or _WITHDRAWN.search(text, start, following[0])
        ):
            continue
        key = re.sub(r"\s+", "", answer)
        kept.pop(key, None)
        kept[key] = answer
    return list(kept.values())


#: (start, end, answer, how) of one answer statement: `end` is where the text it read ends.
Statement = tuple[int, int, str, str]


def _sentences(text: str) -> list[Statement]:
    found = []
    matches = list(_SENTENCE.finditer(text))
    for match, after in zip(matches, [*matches[1:], None][: len(matches)], strict=True):
        stop = after.start() if after else len(text)
        newline = text.find("\n", match.end(), stop)
        stop = stop if newline < 0 else newline
        answer = clean_statement(text[match.end() : stop])
        conjunction = _TRAILING_CONJUNCTION.search(answer)
        if conjunction:  # `x = 7, and` (the sentence went on)
            answer = answer[: conjunction.start()].rstrip().removesuffix(",").strip()
        if answer and not _VERDICT.match(answer):
            found.append((match.start(), stop, answer, "answer_is"))
    return found


def _line_end(text: str, start: int) -> int:
    end = text.find("\n", start)
    return len(text) if end < 0 else end


def _answer_lines(text: str) -> list[Statement]:
    """Answer lines and `Final Answer` headings. Each reads its own line, or the next non-empty
    one: never the rest of the text (which made 20,000 `Answer:` lines take 10 s)."""
    found = []
    for pattern in (_ANSWER_LINE, _ANSWER_HEADING):
        for match in pattern.finditer(text):
            stop = _line_end(text, match.end())
            line = text[match.end() : stop].lstrip("*_ \t")
            if not line.strip("*_ \t"):  # the answer on the next non-empty line
                while not line.strip() and stop < len(text):
                    begin, stop = stop + 1, _line_end(text, stop + 1)
                    line = text[begin:stop]
            answer = clean_statement(line)
            if answer:
                found.append((match.start(), stop, answer, "answer_line"))
    return found


def _gsm8k(text: str) -> list[Statement]:
    """GSM8K's `#### <answer>` markers (a markdown heading is not one)."""
    found = []
    for match in _HASHES.finditer(text):
        answer = match.group(1).strip().strip("*_").strip()
        if _is_gsm8k_answer(answer):
            found.append((match.start(), match.end(), clean_statement(answer), "####"))
    return found


def _is_gsm8k_answer(text: str) -> bool:
    """What follows GSM8K's marker: it starts like a number or formula, is not a numbered heading
    (`2. Compute the sum`), and has at most a few words (units)."""
    if not text or text[0] not in "0123456789-+.$\\({[":
        return False
    if _NUMBERED_HEADING.match(text):
        return False
    return len(_WORD.findall(text)) <= 3


def clean_statement(rest: str) -> str:
    """The answer in the text after an answer marker: the first math span if it opens with one,
    else up to the end of the sentence; without markdown emphasis or a trailing period."""
    rest = rest.strip().lstrip(":*_ \t").strip()
    rest = _FILLERS.sub("", rest)
    for left, right in _MATH_SPANS:
        if rest.startswith(left):
            end = _closing(rest, right, len(left))
            if end > len(left):
                return ", ".join(_joined_spans(rest, left, right, end))
            break
    rest = _SENTENCE_END.split(rest, maxsplit=1)[0]
    return _trim(_without_clause(rest))


#: Words that make what follows a comma another answer (a hedge: `5, or maybe 6`), not a clause.
_HEDGE_WORDS = frozenset("or and nor but either maybe perhaps possibly alternatively also".split())


def _without_clause(answer: str) -> str:
    """`answer` without a clause of words that a comma adds to it: `42, the number of ways` is
    `42`, `No, there is none` is `No` (a sentence is not a list of answers). A clause is two or
    more words and nothing else (no digit, no math), none of them `or`, `and`, `maybe` ...;
    `3, 4`, `A, B` and `Tuesday, Thursday` stay lists."""
    start = len(answer)
    while start and (answer[start - 1].isalpha() or answer[start - 1] in " \t,'-!?"):
        start -= 1  # the longest tail of words and commas
    comma = answer.find(",", start)
    if comma < 0:
        return answer
    words = re.findall(r"[a-zA-Z]+", answer[comma:])
    if len(words) < 2 or len(words[0]) < 2 or _HEDGE_WORDS.intersection(map(str.lower, words)):
        return answer
    return answer[:comma]


#: Between math spans that state one answer together: `$3$ or $4$`, `$x = 3$, $x = 4$`.
_SPAN_JOINER = re.compile(r"\s*(?:,\s*)?(?:(?:and|or)\s+)?")


def _joined_spans(rest: str, left: str, right: str, end: int) -> list[str]:
    """The math span that opens `rest` (closing at `end`) and those that follow it joined by a
    comma, `and` or `or`: a hedge (`$3$ or $4$`) is then a list, never its first value."""
    spans = [_trim(rest[len(left) : end])]
    at = end + len(right)
    while True:
        joiner = _SPAN_JOINER.match(rest, at)
        start = joiner.end() if joiner else at
        if start == at or not rest.startswith(left, start):
            return spans
        close = _closing(rest, right, start + len(left))
        if close <= start + len(left):
            return spans
        spans.append(_trim(rest[start + len(left) : close]))
        at = close + len(right)


def _closing(text: str, right: str, start: int) -> int:
    """Index of the first `right` from `start` that is not escaped (`\\$` is a dollar sign)."""
    end = text.find(right, start)
    while end > 0 and text[end - 1] == "\\" and right == "$":
        end = text.find(right, end + 1)
    return end


def _trim(answer: str) -> str:
    answer = answer.strip().strip("*_").strip()
    if answer.startswith("$") and answer.endswith("$") and len(answer) > 1:
        answer = answer.strip("$").strip()
    return answer.rstrip(".").strip()


def _last_line(text: str) -> str | None:
    """The last non-empty line, when it reads as an answer: a value or `x = value`, no prose
    (at most two words, e.g. a unit) and no other equation (working)."""
    lines = [s for s in text.strip().split("\n") if s.strip()]
    if not lines:
        return None
    answer = _trim(lines[-1].strip().lstrip("#>*_- \t"))
    answer = _trim(re.sub(r"^\\\(|\\\)$|^\\\[|\\\]$", "", answer))
    core = re.sub(r"^[a-zA-Z]\s*=", "", answer)
    if not answer or "=" in core or len(_WORD.findall(core)) > 2:
        return None
    return answer
