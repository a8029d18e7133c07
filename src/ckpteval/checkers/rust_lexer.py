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
from dataclasses import dataclass
from functools import lru_cache

IDENT = "ident"
LIFETIME = "lifetime"
LITERAL = "literal"  # a string, byte string, C string or char literal
NUMBER = "number"
PUNCT = "punct"
COMMENT = "comment"


@dataclass(frozen=True, slots=True)
class Token:
    """One token: `text` is an identifier's name (without `r#`), a literal's body between its
    quotes (escapes as written), or the characters of anything else."""

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


_NEXT = re.compile(
    r"""(?P<space>\s+)
      | (?P<line>//[^\n]*)
      | (?P<block>/\*)
      | (?P<rawstr>[bc]?r(?P<hashes>\#*)")
      | (?P<str>[bc]?")
      | r\#(?P<rawident>[^\W\d]\w*)
      | (?P<char>b?'(?:[^'\\\n]|\\(?:u\{[^}'\n]*\}|x[0-9A-Fa-f]{2}|.))')
      | (?P<lifetime>'(?:r\#)?[^\W\d]\w*)
      | (?P<number>\d[0-9_]*(?:\.[0-9][0-9_]*)?(?:[eE][+-]?[0-9_]+)?\w*)
      | (?P<ident>[^\W\d]\w*)
      | (?P<punct>::|->|=>|.)
    """,
    re.S | re.X,
)
_BLOCK_EDGE = re.compile(r"/\*|\*/")
_STRING_REST = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*"', re.S)


@lru_cache(maxsize=256)
def lex(source: str) -> tuple[Token, ...]:
    """Every token of `source`, comments included (kind COMMENT), whitespace left out."""
    out: list[Token] = []
    pos, end = 0, len(source)
    while pos < end:
        match = _NEXT.match(source, pos)
        assert match is not None  # the last alternative takes any character
        kind = match.lastgroup
        if kind == "space":
            pos = match.end()
            continue
        if kind == "block":
            stop = _block_comment_end(source, match.end())
            out.append(Token(COMMENT, source[pos:stop], pos, stop))
        elif kind == "line":
            stop = match.end()
            out.append(Token(COMMENT, source[pos:stop], pos, stop))
        elif kind == "rawstr":  # `r`, its hashes and the opening quote were matched
            closing = '"' + match.group("hashes")
            found = source.find(closing, match.end())
            stop = end if found < 0 else found + len(closing)
            body_end = end if found < 0 else found
            out.append(Token(LITERAL, source[match.end() : body_end], pos, stop))
        elif kind == "str":
            rest = _STRING_REST.match(source, match.end())
            stop = rest.end() if rest else end
            out.append(Token(LITERAL, source[match.end() : stop - 1 if rest else end], pos, stop))
        elif kind == "rawident":
            stop = match.end()
            out.append(Token(IDENT, match.group("rawident"), pos, stop, raw=True))
        elif kind == "char":
            stop = match.end()
            text = match.group()
            out.append(Token(LITERAL, text[text.index("'") + 1 : -1], pos, stop))
        else:
            stop = match.end()
            kinds = {"lifetime": LIFETIME, "number": NUMBER, "ident": IDENT, "punct": PUNCT}
            out.append(Token(kinds[kind], match.group(), pos, stop))  # type: ignore[index]
        pos = stop
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


@lru_cache(maxsize=256)
def tokens(source: str) -> tuple[Token, ...]:
    """The tokens of `source` that are code: comments (doc comments included) left out."""
    return tuple(t for t in lex(source) if t.kind != COMMENT)


def blank_comments_and_literals(source: str) -> str:
    """`source` with every comment and literal replaced by spaces, newlines kept (so offsets
    and line numbers still match the source)."""
    pieces, pos = [], 0
    for token in lex(source):
        if token.kind in (COMMENT, LITERAL):
            pieces.append(source[pos : token.start])
            pieces.append(re.sub(r"[^\n]", " ", source[token.start : token.end]))
            pos = token.end
    pieces.append(source[pos:])
    return "".join(pieces)
