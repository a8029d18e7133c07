"""Units of measure after a math answer's number (docs/evaluate.md, "Math answers").

`5 km` is not `5 cm`: the unit words after a number are read as a unit (`Unit`), and two answers
with units compare equal only in the same unit. A unit is known (a length, mass, time, volume,
money or a rate of them, under any of its usual spellings: `cm`, `centimeters`, `\\text{ cm}`),
or else a word this table does not know, which equals only the same word (`35 diagonals`,
`13 packs`; a plural is its singular). Known units of the same kind but different size (`0.05 km`
against `50 m`) are a different unit still, and `compare` says when the values agree once
converted, so a score line tells a wrong unit from a converted one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

#: canonical symbol -> (base quantity, size in that base's unit), with the spellings it has.
_UNITS: dict[str, tuple[str, Fraction, tuple[str, ...]]] = {
    "mm": ("length", Fraction(1, 1000), ("millimeter", "millimetre")),
    "cm": ("length", Fraction(1, 100), ("centimeter", "centimetre")),
    "m": ("length", Fraction(1), ("meter", "metre")),
    "km": ("length", Fraction(1000), ("kilometer", "kilometre")),
    "in": ("length", Fraction(254, 10000), ("inch", "inches")),
    "ft": ("length", Fraction(3048, 10000), ("foot", "feet")),
    "yd": ("length", Fraction(9144, 10000), ("yard",)),
    "mi": ("length", Fraction(1609344, 1000), ("mile",)),
    "mg": ("mass", Fraction(1, 1000), ("milligram",)),
    "g": ("mass", Fraction(1), ("gram", "gm")),
    "kg": ("mass", Fraction(1000), ("kilogram",)),
    "lb": ("mass", Fraction(45359237, 100000), ("pound", "lbs")),
    "oz": ("mass", Fraction(45359237, 1600000), ("ounce",)),
    "ms": ("time", Fraction(1, 1000), ("millisecond",)),
    "s": ("time", Fraction(1), ("second", "sec")),
    "min": ("time", Fraction(60), ("minute",)),
    "h": ("time", Fraction(3600), ("hour", "hr", "hrs")),
    "day": ("time", Fraction(86400), ()),
    "week": ("time", Fraction(604800), ("wk",)),
    "ml": ("volume", Fraction(1, 1000), ("milliliter", "millilitre")),
    "l": ("volume", Fraction(1), ("liter", "litre")),
    "dollar": ("money", Fraction(1), ("usd",)),
    "cent": ("money", Fraction(1, 100), ()),
}
_SPELLINGS = {
    spelling: symbol
    for symbol, (_, _, spellings) in _UNITS.items()
    for spelling in (symbol, *spellings)
}
#: Rates written as one word.
_RATES = {"mph": "mi/h", "kph": "km/h", "kmh": "km/h"}
_POWER_WORDS = {"square": 2, "sq": 2, "cubic": 3, "cu": 3}


@dataclass(frozen=True)
class Unit:
    """A unit as read: `text` its canonical spelling (`cm^2`, `mi/h`, `diagonal`); `kind` the
    powers of its base quantities ((("length", 2),) for `cm^2`), None for a word the table does
    not know; `size` in the bases' units (for a known unit)."""

    text: str
    kind: tuple[tuple[str, int], ...] | None
    size: Fraction


def read_unit(text: str) -> Unit:
    """The unit that the unit words `text` (as `ckpteval.checkers.math_equiv.split_units` cuts
    them from an answer: `\\text{ cm}^2`, `square centimeters`, `miles per hour`) name."""
    text = re.sub(r"\\(?:text|mbox|mathrm|textnormal)\s*\{([^{}]*)\}", r" \1 ", text)
    text = re.sub(r"[{}]", "", text.lower()).replace(".", " ")
    text = re.sub(r"\s*\^\s*", "^", text).strip()
    text = _RATES.get(text, text)
    parts = re.split(r"\s+per\s+|\s*/\s*", text, maxsplit=1)
    top, bottom = parts[0], parts[1] if len(parts) > 1 else ""
    numerator = _power(top)
    if not bottom:
        return numerator
    denominator = _power(bottom)
    spelt = f"{numerator.text}/{denominator.text}"
    if numerator.kind is None or denominator.kind is None:
        return Unit(spelt, None, Fraction(1))
    kind = dict(numerator.kind)
    for base, power in denominator.kind:
        kind[base] = kind.get(base, 0) - power
    return Unit(spelt, _kind(kind), numerator.size / denominator.size)


def _power(text: str) -> Unit:
    """A unit with no `per`: a word or symbol, raised by `square`/`cubic` before it or `^2`/`^3`
    after it."""
    words = text.split()
    power = 1
    if len(words) > 1 and words[0] in _POWER_WORDS:
        power, words = _POWER_WORDS[words[0]], words[1:]
    name = " ".join(words)
    raised = re.fullmatch(r"(.*?)\^([23])", name)
    if raised:
        name, power = raised.group(1).strip(), power * int(raised.group(2))
    symbol = _symbol(name)
    spelt = (symbol or _singular(name)) + (f"^{power}" if power != 1 else "")
    if symbol is None:
        return Unit(spelt, None, Fraction(1))
    base, size, _ = _UNITS[symbol]
    return Unit(spelt, _kind({base: power}), size**power)


def _symbol(name: str) -> str | None:
    for candidate in (name, name.removesuffix("s"), name.removesuffix("es")):
        if candidate in _SPELLINGS:
            return _SPELLINGS[candidate]
    return None


def _singular(word: str) -> str:
    return word[:-1] if word.endswith("s") and not word.endswith("ss") else word


def _kind(powers: dict[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((base, power) for base, power in powers.items() if power))


def compare(gold: str, answer: str) -> str:
    """How the unit words of an answer stand to the gold's: `same` (or one side has none: the
    problem names the unit, so a bare number answers it, and a count noun after a number says
    what it counts), `converted` (the same kind of quantity in another unit: the caller compares
    the values converted, to say so), or `different`."""
    if not gold or not answer:
        return "same"
    g, a = read_unit(gold), read_unit(answer)
    if g.kind is None or a.kind is None:
        return "same" if g.text == a.text else "different"
    if g.kind != a.kind:
        return "different"
    return "same" if g.size == a.size else "converted"


def size_ratio(gold: str, answer: str) -> Fraction:
    """How many of the gold's unit one of the answer's unit is (`converted` units only)."""
    return read_unit(answer).size / read_unit(gold).size
