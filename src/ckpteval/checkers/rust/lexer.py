"""Rust source read as rustc's lexer reads it: tokens, with comments and literals told apart.

The rust checker decides on a sample's text (what it refuses, what it flags, how it assembles
the crate). Raw text is the wrong input for that: a word in a comment or a string is not code,
`/* a /* b */ unsafe */` is all comment (Rust block comments nest), `r#"..."#` ends only at its
own number of `#`, `'a` is a lifetime but `'a'` a char, and `r#String` names `String` while
`r#unsafe` is an identifier, not the keyword. `tokens` reads source the way rustc does for all of
these, in one linear pass (unterminated comments and literals run to the end, as rustc reports
them), so decisions can compare identifiers and token sequences instead of substrings.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from typing import NamedTuple

IDENT = "ident"
LIFETIME = "lifetime"
LITERAL = "literal"  # a string, byte string, C string or char literal
NUMBER = "number"
PUNCT = "punct"
COMMENT = "comment"


class Token(NamedTuple):
    """One token: `text` is an identifier's name (without `r#`), a literal's body between its
    quotes (escapes as written), or the characters of anything else. (A tuple: a long sample
    has tens of thousands, and a tuple is the cheapest record to build.)"""

    kind: str
    text: str
    start: int
    end: int
    raw: bool = False  # a raw identifier (`r#name`): never a keyword

    def keyword(self, *words: str) -> bool:
        """Whether this is one of the keywords `words` (a raw identifier never is)."""
        return self.kind == IDENT and not self.raw and self.text in words

    def ident(self, *names: str) -> bool:
        """Whether this is an identifier named one of `names` (raw or not)."""
        return self.kind == IDENT and self.text in names

    def punct(self, *marks: str) -> bool:
        return self.kind == PUNCT and self.text in marks


#: The lexemes that open comments and literals, shared by `lex` and
#: `blank_comments_and_literals`. Block comments and raw strings (whose ends a regular pattern
#: cannot find: comments nest, raw strings end at their own number of `#`) and unterminated
#: strings are only opened here; the caller finds their ends.
_OPENERS = r"""
        (?P<line>//[^\n]*)
      | (?P<block>/\*)
      | (?P<rawstr>[bc]?r(?P<hashes>\#*)")
      | (?P<str>[bc]?"(?P<body>[^"\\]*(?:\\.[^"\\]*)*)")
      | (?P<open>[bc]?")
      | (?P<char>b?'(?P<value>[^'\\\n]|\\(?:u\{[^}'\n]*\}|x[0-9A-Fa-f]{2}|.))')
      | (?P<lifetime>'(?:r\#)?[^\W\d]\w*)"""
#: One token after any whitespace.
_NEXT = re.compile(
    rf"""\s*(?:{_OPENERS}
      | r\#(?P<rawident>[^\W\d]\w*)
      | (?P<number>\d[0-9_]*(?:\.[0-9][0-9_]*)?(?:[eE][+-]?[0-9_]+)?\w*)
      | (?P<ident>[^\W\d]\w*)
      | (?P<punct>::|->|=>|.)
      | (?P<end>\Z)
    )""",
    re.S | re.X,
)
#: The same lexemes where only comments and literals matter: words and runs of other characters
#: are passed over whole (a word is never split, so `bar"x"` holds no raw string `r"x"`).
_NEXT_LITERAL = re.compile(rf"""{_OPENERS} | r\#[^\W\d]\w* | \w+ | [^\w/"']+ | .""", re.S | re.X)
_KINDS = {"line": COMMENT, "lifetime": LIFETIME, "number": NUMBER, "ident": IDENT, "punct": PUNCT}
_BLOCK_EDGE = re.compile(r"/\*|\*/")


@lru_cache(maxsize=8)
def lex(source: str) -> tuple[Token, ...]:
    """Every token of `source`, comments included (kind COMMENT), whitespace left out. (Cached:
    a unit's assembly reads the same program and completion several times in a row; a few
    entries do, and bound the memory a long text's tokens take.)"""
    out: list[Token] = []
    new = tuple.__new__  # builds a Token without NamedTuple's Python-level constructor
    resume, end = 0, len(source)
    while resume < end:
        # From `resume` to the end, unless a lexeme needs its end found and lexing resumed.
        at, resume = resume, end
        for match in _NEXT.finditer(source, at):
            kind = match.lastgroup
            at = match.start(kind)  # type: ignore[arg-type]
            if kind in _KINDS:
                out.append(new(Token, (_KINDS[kind], match.group(kind), at, match.end(), False)))
            elif kind == "str":
                out.append(new(Token, (LITERAL, match.group("body"), at, match.end(), False)))
            elif kind == "rawident":
                out.append(new(Token, (IDENT, match.group(kind), at, match.end(), True)))
            elif kind == "char":
                out.append(new(Token, (LITERAL, match.group("value"), at, match.end(), False)))
            elif kind == "end":
                break
            else:
                resume = _end_of(source, match)
                if kind == "block":
                    out.append(Token(COMMENT, source[at:resume], at, resume))
                    break
                closing = '"' + (match["hashes"] or "") if kind == "rawstr" else '"'
                closed = kind == "rawstr" and source.endswith(closing, match.end(), resume)
                body = source[match.end() : resume - len(closing) if closed else resume]
                out.append(Token(LITERAL, body, at, resume))
                break
    return tuple(out)


def _block_comment_end(source: str, at: int) -> int:
    """Where a block comment whose `/*` ends at `at` ends: comments nest, as in rustc."""
    depth = 1
    while depth:
        edge = _BLOCK_EDGE.search(source, at)
        if edge is None:
            return len(source)
        depth += 1 if edge.group() == "/*" else -1
        at = edge.end()
    return at


@lru_cache(maxsize=8)
def tokens(source: str) -> tuple[Token, ...]:
    """The tokens of `source` that are code: comments (doc comments included) left out."""
    return tuple(t for t in lex(source) if t.kind != COMMENT)


@lru_cache(maxsize=8)
def blank_comments_and_literals(source: str) -> str:
    """`source` with every comment and literal replaced by spaces, newlines kept (so offsets
    and line numbers still match the source). Reads the lexemes `lex` reads without building
    tokens: the checker blanks each program several times."""
    pieces, pos = [], 0
    for start, stop in _comments_and_literals(source):
        pieces.append(source[pos:start])
        pieces.append(_NOT_NEWLINE.sub(" ", source[start:stop]))
        pos = stop
    pieces.append(source[pos:])
    return "".join(pieces)


_NOT_NEWLINE = re.compile(r"[^\n]")


def _comments_and_literals(source: str) -> Iterator[tuple[int, int]]:
    """(start, end) of each comment and literal of `source`, in order."""
    resume, end = 0, len(source)
    while resume < end:
        at, resume = resume, end
        for match in _NEXT_LITERAL.finditer(source, at):
            kind = match.lastgroup
            if kind in ("line", "str", "char"):
                yield match.start(), match.end()
            elif kind in ("block", "rawstr", "open"):
                resume = _end_of(source, match)
                yield match.start(), resume
                break


def _end_of(source: str, match: re.Match[str]) -> int:
    """Where the block comment, raw string or unterminated string `match` opens ends."""
    if match.lastgroup == "block":
        return _block_comment_end(source, match.end())
    found = source.find('"' + match.group("hashes"), match.end()) if match["rawstr"] else -1
    return len(source) if found < 0 else found + 1 + len(match.group("hashes"))
