"""When a math answer equals the gold answer (docs/evaluate.md, "Math answers").

Both sides are normalised the same way (`normalise`), then compared by the first stage that
decides (`equivalent` returns it as the score line's `equivalence`):
- `string`: equal once normalised, whitespace ignored (`2 i` is `2i`);
- `text`: equal as text: `\\text{}` unwrapped, case, spacing and punctuation ignored
  (`5:15 PM` is `5:15 p.m.`, `(B)` is `B`);
- `unit`: both sides have unit words after their number and the units differ (`5 km`, `5 cm`;
  `unit+converted` when the values agree once converted): wrong (ckpteval.checkers.math_units);
- `too_large`: a number with a power of ten beyond `MAX_EXPONENT`, not equal as written: wrong;
- `number`: both plain numbers, compared exactly as rationals (`$1,234.50`, `3/4`, `\\frac{3}{4}`,
  `1.5e3`, `25%`, `2.5 million`, `twenty-five`); a percent against a bare number matches its
  value or its digits;
- `list`: comma lists compared item by item: tuples, intervals and vectors in order with the same
  brackets, sets (`\\{1, 2\\}`) and bare lists (`1, 2`: MATH's "all solutions") in any order;
  a sentence (`No, there is none`) is not a list;
- `math_verify`: math-verify (sympy) on the normalised forms. An answer with words (`Tuesday`)
  never goes there, as sympy would read it as a product of letters that any anagram equals: it
  is `text` or wrong.
Unit words after a number are cut off both sides first and compared (`+units`; a unit on one
side only is dropped); a thousands separator is one only in true groups of three (`1,234` is
1234, `1,2,3` is a list). Forms math-verify cannot parse are rewritten first (`+rewrite`:
unicode `√`, `π`, `×`, `\\sqrt2`, `\\sqrt[3]4`, `\\frac12`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction

from ckpteval.checkers import math_units

#: A math-verify call: True/False, or None when it ran out of time.
Verify = Callable[[str, str], "bool | None"]

_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?:/\d+)?")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_LATEX_FRAC = re.compile(r"(-?)\\frac\{(-?\d+)\}\{(\d+)\}")
_ENVIRONMENT = re.compile(r"\\(?:begin|end|operatorname)\{[a-zA-Z*]+\}")
_WRAPPER = re.compile(r"^\\(?:text|textbf|mathrm|mbox|mathbf|textnormal)\{(.*)\}$", re.S)
_FUNCTIONS = frozenset(
    "sin cos tan cot sec csc log ln exp sqrt pi arcsin arccos arctan sinh cosh tanh "
    "max min gcd lcm mod det infty inf".split()
)
#: Words after a number that change it or tell it apart (`5 million`, `5:15 PM`): not units.
_NOT_UNITS = frozenset(
    "am pm hundred thousand million billion trillion dozen squared cubed percent factorial".split()
)
_BASE = re.compile(r"([0-9A-Za-z]+)_\{?(\d+)\}?")
#: A unit word at the end of a stripped answer: `\\text{...}`, a word of two or more letters, or
#: after a space one of the one-letter unit symbols (`5 m`, `3 g`, `2 h`; `2 i` is no unit).
#: Searched for only in the last `_UNIT_WINDOW` characters, and never with leading or trailing
#: `\s*`: that made every position of a run of spaces start a match that failed at its end
#: (12,000 spaces: seconds per search).
_UNIT_TOKEN = re.compile(
    r"(?:\\(?:text|mbox|mathrm)\{\s*[a-zA-Z][a-zA-Z ./]*\}|(?<![\\a-zA-Z])[a-zA-Z]{2,}\.?"
    r"|(?<=\s)[mgshlL])(?:\^\{?[23]\}?)?$"
)
_UNIT_WINDOW = 100
_REWRITES: tuple[tuple[str, str], ...] = (
    (r"√\s*\(([^()]*)\)", r"\\sqrt{\1}"),
    (r"√\s*\{", r"\\sqrt{"),
    (r"√\s*([0-9a-zA-Z.]+)", r"\\sqrt{\1}"),
    (r"\\sqrt\s*(\[[^\]]*\])\s*([0-9a-zA-Z])", r"\\sqrt\1{\2}"),
    (r"\\sqrt\s*([0-9a-zA-Z])", r"\\sqrt{\1}"),
    (r"\\frac\s*([0-9a-zA-Z])\s*([0-9a-zA-Z])", r"\\frac{\1}{\2}"),
    (r"\\frac\s*([0-9a-zA-Z])\s*\{", r"\\frac{\1}{"),
    ("π", r"\\pi "),
    ("∞", r"\\infty "),
    ("×", r"\\times "),
    ("·", r"\\cdot "),
    ("÷", "/"),
    ("−", "-"),
    ("²", "^2"),
    ("³", "^3"),
    ("≤", r"\\le "),
    ("≥", r"\\ge "),
)
_CLEANUPS: tuple[tuple[str, str], ...] = (
    (r"\\[dt]frac", r"\\frac"),
    (r"\\displaystyle", ""),
    (r"\\(?:left|right|big|Big|bigg|Bigg)(?![a-zA-Z])\s*", ""),
    (r"(?<!\\)\\[!,;: ]|~", " "),
    (r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|°|\\degree", ""),
    (r"\\%", "%"),
    (r"(\d)\s*percent\b", r"\1%"),
    (r"\\\$", "$"),
    (r"\\mbox\{", r"\\text{"),
)


def normalise(text: str) -> tuple[str, bool]:
    """(normal form, whether a form math-verify cannot parse was rewritten)."""
    text = text.strip()
    text = re.sub(r"(\d)(?:\{,\}|,\\!|\\,)\s*(?=\d{3}(?!\d))", r"\1,", text)  # 1{,}234, 1,\!234
    rewritten = text
    for pattern, repl in _REWRITES:
        rewritten = re.sub(pattern, repl, rewritten)
    changed = rewritten != text
    text = rewritten
    for pattern, repl in _CLEANUPS:
        text = re.sub(pattern, repl, text)
    text = _unwrap_math(text)
    if _THOUSANDS.fullmatch(text.lstrip("$").strip()):
        text = text.replace(",", "")
    return text, changed


def _unwrap_math(text: str) -> str:
    """Without `$`/`\\(`/`\\[` delimiters, a whole-answer `\\text{}`, a leading currency sign, or a
    trailing period."""
    previous = None
    while previous != text:
        previous = text
        text = text.strip().rstrip(".").strip()
        for left, right in (("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if text.startswith(left) and text.endswith(right) and len(text) > len(left + right):
                text = text[len(left) : -len(right)].strip()
        if text.startswith("{") and text.endswith("}") and _encloses(text):
            text = text[1:-1].strip()  # TeX grouping braces around the whole answer
        match = _WRAPPER.match(text)
        if match and "}" not in match.group(1).replace("\\}", ""):
            text = match.group(1).strip()
        if text.startswith("$") and "$" not in text[1:]:
            text = text[1:]
    return text


def split_units(text: str) -> tuple[str, str]:
    """(`text` without the unit words after its number, those words) (`35 diagonals`, `40 miles
    per hour`, `2\\text{ cm}^2`, `18.9 dollars`); (`text`, "") when it has none. Unit words are
    words of two or more letters, or `\\text{}`, that follow a part with a digit and no letters
    outside LaTeX commands but number words (`2.5 million dollars`). Single letters stay (`2 i`)."""
    rest = text.strip()
    while True:
        match = _UNIT_TOKEN.search(rest, max(0, len(rest) - _UNIT_WINDOW))
        if not match or match.start() == 0 or text_key(match.group(0)) in _NOT_UNITS:
            break
        rest = rest[: match.start()].rstrip()
    if rest == text.strip() or not re.search(r"\d", rest):
        return text, ""
    if has_letters(rest) and words_number(rest) is None:
        return text, ""
    return rest, text.strip()[len(rest) :].strip()


def has_letters(text: str) -> bool:
    """Whether `text` has letters outside LaTeX command names."""
    return bool(re.search(r"[a-zA-Z]", re.sub(r"\\[a-zA-Z]+", "", _ENVIRONMENT.sub("", text))))


def is_prose(text: str) -> bool:
    """Whether `text` has a word (three or more letters, not a LaTeX command or a function name):
    sympy would read it as a product of symbols, which anagrams equal."""
    words = re.findall(r"(?<![\\a-zA-Z])[a-zA-Z]{3,}", _ENVIRONMENT.sub("", text))
    return any(w.lower() not in _FUNCTIONS for w in words)


def as_number(text: str) -> Fraction | None:
    """`text` as an exact rational if it is a plain number (currency, true thousands separators,
    a trailing period or percent sign allowed; a percent is its value: `25%` is 1/4), else None."""
    parsed = _number(normalise(text)[0])
    if parsed is None:
        return None
    value, percent = parsed
    return value / 100 if percent else value


def _number(text: str) -> tuple[Fraction, bool] | None:
    """(value as written, whether a percent sign followed) of a normalised plain number."""
    cleaned = text.strip().lstrip("$").strip()
    if "," in cleaned:
        if not _THOUSANDS.fullmatch(cleaned.rstrip("%").strip()):
            return None
        cleaned = cleaned.replace(",", "")
    percent = cleaned.endswith("%")
    cleaned = cleaned.rstrip("%").strip()
    frac = _LATEX_FRAC.fullmatch(cleaned)
    if frac:
        sign = -1 if frac.group(1) else 1
        if int(frac.group(3)) == 0:
            return None
        return sign * Fraction(int(frac.group(2)), int(frac.group(3))), percent
    if not _NUMBER.fullmatch(cleaned):
        words = words_number(cleaned) if re.search("[a-zA-Z]{3}", cleaned) else None
        return None if words is None else (words, percent)
    if oversized(cleaned):
        return None
    try:
        return Fraction(cleaned), percent
    except (ValueError, ZeroDivisionError):
        return None


#: The largest power of ten a number may be written with (`1e1000`) and still be read as its
#: exact value: `1e100000000` as a Fraction is 10^(10^8), minutes and hundreds of MB to build.
#: A number beyond it is compared only as written (`equivalence: too_large` when that fails).
MAX_EXPONENT = 1000
_EXPONENT = re.compile(r"(?<=[\d.])[eE][-+]?0*(\d+)")


def oversized(text: str) -> bool:
    """Whether `text` writes a number with a power of ten beyond `MAX_EXPONENT` (`1e100000000`)."""
    return any(
        len(m.group(1)) > len(str(MAX_EXPONENT)) or int(m.group(1)) > MAX_EXPONENT
        for m in _EXPONENT.finditer(text)
    )


_ONES = {
    word: value
    for value, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
        "fifteen sixteen seventeen eighteen nineteen".split()
    )
}
_TENS = {
    word: 10 * value
    for value, word in enumerate(
        "twenty thirty forty fifty sixty seventy eighty ninety".split(), start=2
    )
}
_SCALES = {"thousand": 10**3, "million": 10**6, "billion": 10**9, "trillion": 10**12}
#: What may follow a written number (`2.5 million`, `3 dozen`, `2 hundred thousand`).
_MULTIPLIERS = {"dozen": 12, "hundred": 100, **_SCALES}
_DECIMAL = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)")


def words_number(text: str) -> Fraction | None:
    """A number written with words as an exact rational: a decimal and scale words (`2.5
    million`, `3 thousand`, `4 dozen`) or an English number (`twenty-five`, `three hundred and
    five`, `five million two hundred thousand`); None for any other text."""
    words = [w for w in re.split(r"[\s-]+", text.strip().lower()) if w]
    if not words or len(words) > 16:
        return None
    if _DECIMAL.fullmatch(words[0]):
        if len(words) == 1 or any(w not in _MULTIPLIERS for w in words[1:]):
            return None
        value = Fraction(words[0])
        for word in words[1:]:
            value *= _MULTIPLIERS[word]
        return value
    total, at, last_scale = 0, 0, None
    while at < len(words):
        chunk, at = _below_thousand(words, at)
        if chunk is None:
            return None
        if at == len(words):
            return Fraction(total + chunk)
        scale = _SCALES.get(words[at])
        if scale is None or (last_scale is not None and scale >= last_scale):
            return None
        total, at, last_scale = total + chunk * scale, at + 1, scale
        if at < len(words) and words[at] == "and":  # two thousand and twenty
            at += 1
    return Fraction(total)


def _below_thousand(words: list[str], at: int) -> tuple[int | None, int]:
    """(the number under a thousand that `words[at:]` start with, where it ends)."""
    value, found = 0, False
    if at + 1 < len(words) and 0 < _ONES.get(words[at], 0) < 10 and words[at + 1] == "hundred":
        value, at, found = 100 * _ONES[words[at]], at + 2, True
        if at < len(words) and words[at] == "and":
            at += 1
    if at < len(words) and words[at] in _TENS:
        value, at, found = value + _TENS[words[at]], at + 1, True
        if at < len(words) and 0 < _ONES.get(words[at], 0) < 10:
            value, at = value + _ONES[words[at]], at + 1
    elif at < len(words) and words[at] in _ONES and not (found and words[at] == "zero"):
        value, at, found = value + _ONES[words[at]], at + 1, True
    return (value if found else None), at


def text_key(text: str) -> str:
    """`text` as a text answer: `\\text{}` unwrapped, lower case, no spacing, no `$*"'`, no periods
    but decimal points, a lone letter's parentheses dropped (`(B)` is `b`)."""
    text = re.sub(r"\\(?:text|textbf|mathrm|mbox|textnormal)\{([^{}]*)\}", r"\1", text)
    text = re.sub(r"[\s$*\"'`]", "", text.lower())
    text = re.sub(r"\.(?!\d)", "", text)
    text = re.sub(r"\(([a-z])\)", r"\1", text)
    return text.rstrip("!?;:")


_LONE_VARIABLE = re.compile(r"^[a-zA-Z](?:_\{?\w+\}?)?\s*(?:=|\\in(?![a-zA-Z]))\s*(.+)$", re.S)
_OPENERS, _CLOSERS = "([{", ")]}"
#: Words that join several answers into one statement: a list (`x = 3 or x = 4`: all the roots)
#: or a hedge (`3 or 4` for one value), which then fails as a list against a single gold.
_CONNECTIVE = re.compile(r"\\text\{\s*(?:and|or)\s*\}|\b(?:and|or)\b")
#: Relations: an answer that is an equation (`17 = 3`), or an inequality between numbers
#: (`17 > 3`), states no value unless the gold is a relation too; `x > 2` is left to math-verify
#: (it may be an interval's answer).
_EQUATION = re.compile(r"=|\\(?:neq|ne|approx)(?![a-zA-Z])|≠")
_INEQUALITY = re.compile(r"<|>|\\(?:le|ge|leq|geq|lt|gt)(?![a-zA-Z])|≤|≥")
_PLUS_MINUS = re.compile(r"\\pm(?![a-zA-Z])|±")


def equivalent(gold: str, answer: str, verify: Verify) -> tuple[bool | None, str]:
    """(whether `answer` equals `gold`, the stage that decided); None when math-verify ran out
    of time. A lone `x =` (or `x \\in`) is dropped from a side when the other has no `=`, and
    `and` separates items when the gold is a list and the answer is not (`3 or 4`, `1 and 2`;
    not `three hundred and five`)."""
    g, g_rewritten = normalise(gold)
    a, a_rewritten = normalise(answer)
    if _CONNECTIVE.search(a) and not _CONNECTIVE.search(g) and words_number(a) is None:
        a = ", ".join(piece.strip().removesuffix(",") for piece in _CONNECTIVE.split(a))
    g, a = _both_signs(g), _both_signs(a)
    same, how = _compare(g, a, verify)
    return same, how + ("+rewrite" if g_rewritten or a_rewritten else "")


def _both_signs(text: str) -> str:
    """`3 \\pm \\sqrt{2}` as the list of its two values (`3 + \\sqrt{2}, 3 - \\sqrt{2}`), as a
    grader reads a ± answer against the roots written out; unchanged unless one ± is in it."""
    if len(_PLUS_MINUS.findall(text)) != 1 or split_list(text) is not None:
        return text
    head, tail = (part.strip() for part in _PLUS_MINUS.split(text))
    if re.fullmatch(r"[a-zA-Z]\s*=", head):  # `x = \\pm 3`
        head = ""
    elif head.endswith("="):
        return text
    return f"{head}+{tail}, {head}-{tail}" if head else f"{tail}, -{tail}"


#: `(x, y) = (1, 2)`: the variables of a system named before its solution.
_NAMED_TUPLE = re.compile(r"^\(\s*[a-zA-Z](?:\s*,\s*[a-zA-Z])+\s*\)\s*=\s*(\(.+\))$", re.S)


def _drop_lone_variable(text: str, other: str) -> str:
    match = _LONE_VARIABLE.match(text) or _NAMED_TUPLE.match(text)
    if not match or "=" in other or "=" in match.group(1):  # `x = 1, y = 2`: each item its own
        return text
    return match.group(1).strip()


def _system_as_tuple(g: tuple[str, str, list[str]], a: tuple[str, str, list[str]]) -> bool:
    """Whether `a` is a solved system (`x = 1, y = -2`: a bare list of distinct lone variables)
    answering the tuple `g` (`(1, -2)`); its values are then compared in the variables' order."""
    if g[0] != "(" or a[0] != "" or len(g[2]) != len(a[2]):
        return False
    names = [re.match(r"\s*([a-zA-Z])\s*=", item) for item in a[2]]
    return all(names) and len({m.group(1) for m in names}) == len(names)  # type: ignore[union-attr]


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _compare(g: str, a: str, verify: Verify) -> tuple[bool | None, str]:
    """The stages after normalisation (module docstring), first that decides."""
    g, a = _drop_lone_variable(g, a), _drop_lone_variable(a, g)
    if _squash(g) == _squash(a):
        return True, "string"
    key = text_key(g)
    if re.search("[a-z]", key) and key == text_key(a):
        return True, "text"
    (gu, g_unit), (au, a_unit) = split_units(g), split_units(a)
    suffix = "+units" if g_unit or a_unit else ""
    units = math_units.compare(g_unit, a_unit)
    if units != "same":  # `5 km` is not `5 cm`; `0.05 km` is `50 m`, in another unit
        gn, an = _number(gu), _number(au)
        converted = (
            units == "converted"
            and gn is not None
            and an is not None
            and gn[1] == an[1]
            and an[0] * math_units.size_ratio(g_unit, a_unit) == gn[0]
        )
        return False, "unit+converted" if converted else "unit"
    if suffix and _squash(gu) == _squash(au):
        return True, "string" + suffix
    if oversized(gu) or oversized(au):  # compared as written, which the stages above did
        return False, "too_large" + suffix
    same = _numbers_equal(gu, au)
    if same is not None:
        return same, "number" + suffix
    g_base, a_base = _BASE.fullmatch(gu), _BASE.fullmatch(au)
    if g_base or a_base:  # a number in a base: its digits and its base, as written
        same = bool(g_base and a_base and g_base.groups() == a_base.groups()) or bool(
            g_base and not a_base and _squash(au).upper() == g_base.group(1).upper()
        )  # the digits alone answer "in base 2" as the problem asked for them
        return same, "string" + suffix
    g_list, a_list = split_list(gu), split_list(au)
    if g_list is not None or a_list is not None:
        return _lists_equal(g_list, a_list, verify), "list" + suffix
    if _is_relation(au) and not (_EQUATION.search(gu) or _INEQUALITY.search(gu)):
        return False, "relation" + suffix  # `\\boxed{17 = 3}` states no value
    if is_prose(gu) or is_prose(au):
        return False, "text" + suffix
    return verify(gu, au), "math_verify" + suffix


def _is_relation(text: str) -> bool:
    return bool(_EQUATION.search(text)) or bool(_INEQUALITY.search(text)) and not has_letters(text)


def _numbers_equal(g: str, a: str) -> bool | None:
    """Whether two plain numbers are equal; None unless both are plain numbers. A percent on one
    side only matches the other's value either as a fraction (25% is 0.25) or as written (25)."""
    gn, an = _number(g), _number(a)
    if gn is None or an is None:
        return None
    (gv, gp), (av, ap) = gn, an
    if gp == ap:
        return gv == av
    percent, other = (gv, av) if gp else (av, gv)
    return other in (percent, percent / 100)


def split_list(text: str) -> tuple[str, str, list[str]] | None:
    """(opening bracket, closing bracket, items) of a comma list of two or more items: `(1, 2)`,
    `[2, 5)`, `\\{1, 2\\}`, `\\langle 1, 2\\rangle`, or a bare `1, 2` (brackets ""); else None."""
    text = text.strip()
    for left, right in (("\\{", "\\}"), ("\\langle", "\\rangle")):
        if text.startswith(left) and text.endswith(right):
            items = _top_level_split(text[len(left) : -len(right)])
            return (left, right, items) if items and len(items) >= 2 else None
    if text[:1] in "([" and text[-1:] in ")]" and _encloses(text):
        items = _top_level_split(text[1:-1])
        return (text[0], text[-1], items) if items and len(items) >= 2 else None
    items = _top_level_split(text)
    if items and any(_is_clause(item) for item in items):
        return None  # `No, there is none` is a sentence, not two answers
    return ("", "", items) if items and len(items) >= 2 else None


def _is_clause(item: str) -> bool:
    """Whether a comma-separated part is words of a sentence: no digit, two or more words."""
    words = re.findall(r"(?<![\\a-zA-Z])[a-zA-Z]{2,}", _ENVIRONMENT.sub("", item))
    return len(words) >= 2 and not re.search(r"\d", item)


def _encloses(text: str) -> bool:
    """Whether the first bracket of `text` closes at its last character."""
    depth = 0
    for i, char in enumerate(text):
        depth += (char in _OPENERS) - (char in _CLOSERS)
        if depth == 0:
            return i == len(text) - 1
    return False


def _top_level_split(text: str) -> list[str] | None:
    """`text` split at commas outside brackets; None if its brackets do not balance."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char in _OPENERS) - (char in _CLOSERS)
        if depth < 0:
            return None
        if char == "," and depth == 0:
            items.append(text[start:i].strip())
            start = i + 1
    items.append(text[start:].strip())
    return items if depth == 0 and all(items) else None


def _lists_equal(
    g: tuple[str, str, list[str]] | None, a: tuple[str, str, list[str]] | None, verify: Verify
) -> bool | None:
    """Item by item: in order with the same brackets, or in any order when the gold is a set or a
    bare list and the answer one too."""
    if g is None or a is None or len(g[2]) != len(a[2]):
        return False
    if _system_as_tuple(g, a):  # in the variables' alphabetical order: (x, y), (a, b, c)
        a = (g[0], g[1], [_LONE_VARIABLE.sub(r"\1", item) for item in sorted(map(str.strip, a[2]))])
    unordered = g[0] in ("", "\\{")
    if unordered != (a[0] in ("", "\\{")) or (not unordered and g[:2] != a[:2]):
        return False
    if not unordered:
        for gi, ai in zip(g[2], a[2], strict=True):
            same = _compare(gi, ai, verify)[0]
            if not same:
                return same
        return True
    return _match_unordered(g[2], a[2], verify)


def _match_unordered(golds: list[str], answers: list[str], verify: Verify) -> bool | None:
    left = list(answers)
    for gi in golds:
        for j, ai in enumerate(left):
            same = _compare(gi, ai, verify)[0]
            if same is None:
                return None
            if same:
                del left[j]
                break
        else:
            return False
    return True
