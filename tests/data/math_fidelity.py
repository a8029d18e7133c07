"""Writes math_fidelity.jsonl: labelled math completions for the math checker's fidelity test
(tests/test_math_fidelity.py) and bench/math_fidelity.py.

Every row is built from a shape (a gold answer with renderings that equal it and near misses that
do not) and a style (how a model states the rendering), so its label holds by construction: a
correct rendering stated as a final answer passes, a near miss fails, a completion cut off before
its answer fails. Rows a careful grader could score either way carry `ambiguous: true` and are left
out of the agreement rates. Run `python tests/data/math_fidelity.py` after editing it.

Row fields: id, gold (the answer the problem's solution boxes), completion, label (pass?), shape,
style, ambiguous, note.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).with_suffix(".jsonl")

WORKING = (
    "Let us set up the problem carefully. We write down what is given and what is asked, "
    "then simplify step by step."
)

#: shape -> (gold, renderings equal to it, near misses, whether the gold is a plain number).
SHAPES: dict[str, tuple[str, list[str], list[str], bool]] = {
    "integer": ("42", ["42", "42.0"], ["43", "-42", "4.2"], True),
    "negative": ("-7", ["-7", "- 7"], ["7", "-8"], True),
    "large_integer": ("12345", ["12345", "12,345", "12{,}345"], ["12,354", "1,2,3,4,5"], True),
    "math_thousands": (
        "10,\\!080",
        ["10080", "10,080", "10{,}080", "10,\\!080"],
        ["10,800", "1,0080"],
        True,
    ),
    "fraction": (
        "\\frac{3}{4}",
        ["\\frac{3}{4}", "\\dfrac{3}{4}", "3/4", "0.75", "\\frac34"],
        ["\\frac{4}{3}", "0.7", "\\frac{3}{5}"],
        False,
    ),
    "radical": (
        "2\\sqrt{3}",
        ["2\\sqrt{3}", "\\sqrt{12}", "2\\sqrt3", "2√3"],
        ["3\\sqrt{2}", "\\sqrt{6}", "2\\sqrt{5}"],
        False,
    ),
    "cube_root": (
        "\\sqrt[3]{4}",
        ["\\sqrt[3]{4}", "\\sqrt[3]4"],
        ["\\sqrt[3]{2}", "\\sqrt{4}"],
        False,
    ),
    "radical_fraction": (
        "\\frac{\\sqrt{3}}{2}",
        ["\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}", "√3/2"],
        ["\\frac{\\sqrt{2}}{2}", "\\frac{3}{2}"],
        False,
    ),
    "pi": ("6\\pi", ["6\\pi", "6 \\pi", "6π"], ["3\\pi", "6", "12\\pi"], False),
    "pi_fraction": ("\\frac{\\pi}{3}", ["\\frac{\\pi}{3}", "\\pi/3"], ["\\frac{\\pi}{6}"], False),
    "interval": ("[2,5)", ["[2,5)", "[2, 5)"], ["[2,5]", "(2,5)", "(2,5]"], False),
    "interval_infinity": (
        "(-\\infty,3]",
        ["(-\\infty,3]", "(-\\infty, 3]", "(-∞, 3]"],
        ["(-\\infty,3)", "[3,\\infty)"],
        False,
    ),
    "interval_union": (
        "(-\\infty,1)\\cup(2,\\infty)",
        ["(-\\infty,1)\\cup(2,\\infty)", "(-\\infty, 1) \\cup (2, \\infty)"],
        ["(-\\infty,1]\\cup[2,\\infty)", "(1,2)"],
        False,
    ),
    "tuple": ("(1,-2)", ["(1,-2)", "(1, -2)"], ["(-2,1)", "(1,2)"], False),
    "tuple_fractions": (
        "\\left(\\frac{1}{2}, 3\\right)",
        ["\\left(\\frac{1}{2}, 3\\right)", "(0.5, 3)", "(\\frac12,3)"],
        ["(3, \\frac{1}{2})", "(\\frac{1}{3}, 3)"],
        False,
    ),
    "solution_set": (
        "-1, 3",
        ["-1, 3", "3, -1", "3,-1", "-1 \\text{ and } 3", "x = -1, x = 3"],
        ["-1", "1, 3", "-1, 3, 5", "-1 \\text{ and } 5"],
        False,
    ),
    "braced_set": ("\\{1, 2, 3\\}", ["\\{1,2,3\\}", "\\{3, 2, 1\\}"], ["\\{1, 2\\}", "123"], False),
    "list_not_number": ("1,2,3", ["1,2,3", "3, 2, 1"], ["123", "1,2,4"], False),
    "matrix": (
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        [
            "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
            "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}",
        ],
        ["\\begin{pmatrix} 1 & 3 \\\\ 2 & 4 \\end{pmatrix}"],
        False,
    ),
    "vector": (
        "\\begin{pmatrix} 2 \\\\ -1 \\end{pmatrix}",
        ["\\begin{pmatrix} 2 \\\\ -1 \\end{pmatrix}", "\\begin{pmatrix}2\\\\-1\\end{pmatrix}"],
        ["\\begin{pmatrix} -1 \\\\ 2 \\end{pmatrix}"],
        False,
    ),
    "polynomial": (
        "x^2+2x+1",
        ["x^2+2x+1", "(x+1)^2", "x^2 + 2x + 1"],
        ["(x-1)^2", "x^2+2x-1", "x^2+1"],
        False,
    ),
    "rational_expression": (
        "\\frac{x+1}{2}",
        ["\\frac{x+1}{2}", "(x+1)/2", "\\frac{1}{2}x+\\frac{1}{2}"],
        ["\\frac{x-1}{2}", "\\frac{2}{x+1}"],
        False,
    ),
    "equation": ("y=2x+3", ["y=2x+3", "y = 3 + 2x"], ["y=2x-3", "y=3x+2"], False),
    "degrees": ("60", ["60", "60^\\circ", "60^{\\circ}", "60°"], ["30^\\circ", "120"], True),
    "percent": (
        "25\\%",
        ["25\\%", "25%", "25 percent", "0.25", "25"],
        ["2.5\\%", "75\\%", "20\\%"],
        False,
    ),
    "money": ("\\$18.90", ["\\$18.90", "18.90", "18.9", "\\$18.9"], ["18.09", "\\$19.80"], True),
    "decimal": ("0.125", ["0.125", "\\frac{1}{8}", ".125"], ["0.12", "1.25"], True),
    "scientific": (
        "1.5\\times10^{3}",
        ["1.5\\times10^{3}", "1500", "1.5 \\times 10^3", "1,500"],
        ["1.5\\times10^{4}", "150"],
        False,
    ),
    "complex": ("3+4i", ["3+4i", "3 + 4i", "4i+3"], ["3-4i", "4+3i"], False),
    "imaginary": ("2i", ["2i", "2 i"], ["-2i", "2"], False),
    "text_day": (
        "\\text{Tuesday}",
        ["Tuesday", "\\text{Tuesday}", "\\text{tuesday}"],
        ["Thursday", "Tuesyad", "\\text{Monday}"],
        False,
    ),
    "text_parity": (
        "\\text{even}",
        ["\\text{even}", "even", "Even"],
        ["\\text{odd}", "neither"],
        False,
    ),
    "multiple_choice": ("\\text{(C)}", ["C", "(C)", "\\text{(C)}"], ["(D)", "B"], False),
    "multiple_choice_many": (
        "\\text{A, D}",
        ["A, D", "\\text{A, D}", "D, A"],
        ["A, C", "A"],
        False,
    ),
    "clock_time": (
        "5:15 \\text{ p.m.}",
        ["5:15 p.m.", "5:15 PM", "5:15 pm"],
        ["5:15 AM", "5:51 PM"],
        False,
    ),
    "base_number": ("1011_2", ["1011_2", "1011_{2}"], ["1101_2", "1011_3"], False),
}

#: shape -> (gold, answers with a unit word, near misses with one): "The answer is 35 diagonals."
UNIT_SHAPES: dict[str, tuple[str, list[str], list[str]]] = {
    "units_count": ("35", ["35 diagonals", "35 \\text{ diagonals}"], ["36 diagonals"]),
    "units_packs": ("13", ["13 packs", "13 \\text{packs}"], ["31 packs"]),
    "units_money": ("18.9", ["18.9 dollars", "18.90 dollars"], ["19.8 dollars"]),
    "units_rate": (
        "40",
        ["40 miles per hour", "40 \\text{ miles per hour}"],
        ["45 miles per hour"],
    ),
    "units_area": ("6\\text{ cm}^2", ["6 \\text{ cm}^2", "6", "6 square centimeters"], ["9 cm"]),
}


#: Issue 37's shapes (after the others, so that earlier ids stay): "find all" lists stated in
#: prose, ± against the roots written out, relations that state no value, digits in a base.
MORE_SHAPES: dict[str, tuple[str, list[str], list[str], bool]] = {
    "roots_in_prose": (
        "3, 4",
        ["x = 3 \\text{ or } x = 4", "x=3 \\text{ and } x=4", "4, 3"],
        ["x = 3", "x = 3 \\text{ or } x = 5", "3, 4, 5"],
        False,
    ),
    "plus_minus": (
        "3 \\pm \\sqrt{2}",
        ["3 \\pm \\sqrt{2}", "3+\\sqrt{2}, 3-\\sqrt{2}", "3 - \\sqrt{2}, 3 + \\sqrt{2}"],
        ["3 + \\sqrt{2}", "3 \\pm \\sqrt{3}"],
        False,
    ),
    "plus_minus_number": ("\\pm 3", ["\\pm 3", "3, -3", "-3, 3", "x = \\pm 3"], ["3", "-3"], False),
    "relation_in_box": ("17", ["17", "x = 17"], ["17 = 3", "3 = 17", "17 > 3"], True),
    "base_digits": ("1011_2", ["1011", "1011_{2}"], ["11", "1011_{10}"], False),
    "system_as_tuple": (
        "(1,-2)",
        ["x = 1, y = -2", "y = -2, x = 1", "(x, y) = (1, -2)"],
        ["x = -2, y = 1", "(x, y) = (-2, 1)", "x = 1, x = -2"],
        False,
    ),
    "hedged_text": (
        "\\text{Tuesday}",
        ["Tuesday"],
        ["\\text{Tuesday or Thursday}", "\\text{Tuesday, Thursday}"],
        False,
    ),
}

#: (gold, a right answer, a wrong one) for the hedge and spray rows.
HEDGED = [
    ("42", "42", "43"),
    ("\\frac{3}{4}", "\\frac{3}{4}", "\\frac{4}{3}"),
    ("(1,-2)", "(1,-2)", "(2,1)"),
]


def _boxed(r: str) -> str:
    return f"{WORKING} Putting it together gives the result.\nTherefore the answer is $\\boxed{{{r}}}$."


def _boxed_twice(r: str) -> str:
    return (
        f"{WORKING} First we find $\\boxed{{{r}}}$ as a candidate.\n"
        f"Checking it against the conditions, it holds, so the final answer is $\\boxed{{{r}}}$."
    )


def _minerva(r: str) -> str:
    return f"{WORKING} Putting it together gives the result.\nFinal Answer: The final answer is ${r}$. I hope it is correct."


def _answer_is(r: str) -> str:
    return f"{WORKING} Putting it together gives the result. The answer is ${r}$."


def _answer_is_plain(r: str) -> str:
    return f"{WORKING} Putting it together gives the result. The answer is {r}."


def _gsm8k(r: str) -> str:
    return f"{WORKING} Putting it together gives the result.\n#### {r}"


def _headings(r: str) -> str:
    return (
        "#### Step 1: Understand the problem\nWe list what is given.\n\n"
        "#### Step 2: Solve\nWe simplify step by step.\n\n"
        f"#### Final Answer\n$\\boxed{{{r}}}$"
    )


def _heading_then_gsm8k(r: str) -> str:
    return f"#### Step 1: Set up\n{WORKING}\n\n#### Step 2: Compute\nWe finish the computation.\n#### {r}"


def _bold_label(r: str) -> str:
    return f"{WORKING}\n\n**Answer:** ${r}$"


def _bold_line(r: str) -> str:
    return f"{WORKING}\n\n**Answer: {r}**"


def _final_answer_heading(r: str) -> str:
    return f"### Solution\n{WORKING}\n\n### Final Answer\n\n${r}$"


def _chat_boxed(r: str) -> str:
    return f"### Solution\n{WORKING}\n\n**Final Answer**\n\n\\[\n\\boxed{{{r}}}\n\\]"


#: style -> (render a stated answer, for plain-number golds only).
STYLES = {
    "boxed": (_boxed, False),
    "boxed_twice": (_boxed_twice, False),
    "minerva": (_minerva, False),
    "answer_is": (_answer_is, False),
    "markdown_headings": (_headings, False),
    "bold_label": (_bold_label, False),
    "bold_line": (_bold_line, False),
    "final_answer_heading": (_final_answer_heading, False),
    "chat_boxed": (_chat_boxed, False),
    "gsm8k": (_gsm8k, True),
    "heading_then_gsm8k": (_heading_then_gsm8k, True),
}

#: Pairs a careful grader could score either way (left out of the rates), with why.
AMBIGUOUS = {
    ("percent", "0.25"): "a percent written as a fraction",
    ("percent", "25"): "the percent sign dropped",
    ("units_area", "6 square centimeters"): "a unit spelt out against the gold's symbol",
}


def rows() -> list[dict[str, object]]:
    """Every row, in a fixed order (ids are stable while the tables above are)."""
    out: list[dict[str, object]] = []
    for shape, (gold, good, near, numeric) in SHAPES.items():
        out += _shape_rows(shape, gold, good, near, numeric)
    for shape, (gold, good, near) in UNIT_SHAPES.items():
        out += _unit_rows(shape, gold, good, near)
    out += _truncations()
    out += _self_corrections()
    for shape, (gold, good, near, numeric) in MORE_SHAPES.items():
        out += _shape_rows(shape, gold, good, near, numeric)
    out += _hedges()
    for shape, (gold, good, near) in ROUND_FOUR_SHAPES.items():
        out += _unit_rows(shape, gold, good, near)
    out += _round_four()
    for i, row in enumerate(out):
        row["id"] = f"mf{i:04d}"
    return [{"id": r.pop("id"), **r} for r in out]


def _row(shape: str, gold: str, completion: str, label: bool, style: str, note: str = "") -> dict:
    rendering = note.split(": ", 1)[-1]
    ambiguous = AMBIGUOUS.get((shape, rendering), "")
    return {
        "gold": gold,
        "completion": completion,
        "label": label,
        "shape": shape,
        "style": style,
        "ambiguous": bool(ambiguous),
        "note": ambiguous or note,
    }


def _shape_rows(shape: str, gold: str, good: list[str], near: list[str], numeric: bool) -> list:
    """Each correct rendering in every style that fits it, each near miss in a few."""
    out = []
    styles = [s for s, (_, only_numbers) in STYLES.items() if numeric or not only_numbers]
    for i, rendering in enumerate(good):
        picked = styles if i == 0 else styles[i % 5 :: 5]
        for style in picked:
            text = STYLES[style][0](rendering)
            out.append(_row(shape, gold, text, True, style, f"correct: {rendering}"))
    for i, rendering in enumerate(near):
        for style in styles[i % 4 :: 4]:
            text = STYLES[style][0](rendering)
            out.append(_row(shape, gold, text, False, style, f"near miss: {rendering}"))
    return out


def _unit_rows(shape: str, gold: str, good: list[str], near: list[str]) -> list:
    out = []
    for rendering in good:
        for style, render in (("answer_is_unit", _answer_is_plain), ("boxed_unit", _boxed)):
            out.append(_row(shape, gold, render(rendering), True, style, f"correct: {rendering}"))
    for rendering in near:
        out.append(
            _row(
                shape,
                gold,
                _answer_is_plain(rendering),
                False,
                "answer_is_unit",
                f"near miss: {rendering}",
            )
        )
    return out


def _truncations() -> list:
    """Completions cut off before any final answer, whose working holds the right value (a parse
    of the whole text can find it there): no answer, so a fail."""
    out = []
    for shape, (gold, good, _, _) in SHAPES.items():
        text = (
            f"{WORKING} A first guess is ${good[0]}$, which we now check against every "
            "condition. Substituting into the second equation, we get"
        )
        out.append(_row(shape, gold, text, False, "truncated", "working only"))
        text = f"{WORKING}\nSo the final answer is $\\boxed{{{good[0]}"
        out.append(_row(shape, gold, text, False, "truncated_box", "box never closed"))
    return out


def _self_corrections() -> list:
    """A first answer corrected by a later statement, no box: the last one stated is the answer."""
    out = []
    for shape in ("integer", "fraction", "text_day", "tuple", "money"):
        gold, good, near, _ = SHAPES[shape]
        right = f"The answer is ${near[0]}$. Wait, I made an arithmetic slip; redoing it, the answer is ${good[0]}$."
        wrong = f"The answer is ${good[0]}$. Wait, I made an arithmetic slip; redoing it, the answer is ${near[0]}$."
        out.append(
            _row(shape, gold, f"{WORKING} {right}", True, "self_correction", "last stated is right")
        )
        out.append(
            _row(
                shape, gold, f"{WORKING} {wrong}", False, "self_correction", "last stated is wrong"
            )
        )
    return out


def _hedges() -> list:
    """Several answers stated as one (a hedge, a spray of boxes): never a pass for one gold value,
    whichever of them is right; the same shapes state a "find all" list, which passes."""
    out = []
    for gold, right, wrong in HEDGED:
        for text, style in (
            (f"{WORKING} The answer is ${right}$ or ${wrong}$.", "hedge_answer_is"),
            (f"{WORKING} The answer is ${wrong}$ or ${right}$.", "hedge_answer_is"),
            (
                f"{WORKING} So the answer is $\\boxed{{{wrong}}}$ or $\\boxed{{{right}}}$.",
                "hedge_boxed",
            ),
            (f"{WORKING}\n\\boxed{{{wrong}}}, \\boxed{{{right}}}, \\boxed{{0}}", "spray_boxed"),
            (
                f"{WORKING} The answer is $\\boxed{{{right} \\text{{ or }} {wrong}}}$.",
                "hedge_in_box",
            ),
        ):
            out.append(_row("hedged", gold, text, False, style, f"hedge: {right} / {wrong}"))
    for text, style in (
        (f"{WORKING} The answer is $x = 3$ or $x = 4$.", "answer_is"),
        (f"{WORKING} So the roots are $\\boxed{{3}}$ and $\\boxed{{4}}$.", "boxes_joined"),
        (f"{WORKING} The answer is $4$, $3$.", "answer_is"),
    ):
        out.append(_row("roots_in_prose", "3, 4", text, True, style, "correct: all roots"))
    return out


#: Issue 48's shapes (after the others, so that earlier ids stay): units compared, not dropped
#: (a different unit, a converted value); numbers in words.
ROUND_FOUR_SHAPES: dict[str, tuple[str, list[str], list[str]]] = {
    "units_length": (
        "5\\text{ cm}",
        ["5 cm", "5 centimeters", "5", "5 \\text{ cm}"],
        ["5 km", "5 m", "50 mm", "6 cm"],
    ),
    "units_rate_symbol": ("40\\text{ mph}", ["40 miles per hour", "40"], ["40 km per hour"]),
    "number_words": (
        "2500000",
        ["2.5 million", "2,500,000", "2.5 million dollars"],
        ["2.5 billion", "25 million", "2.5"],
    ),
}


def _round_four() -> list:
    """Several different final answers (round 3's spray of answer sentences, answer lines and
    boxes in separate sentences, the right one last): a fail, while the same answer restated, or
    a withdrawn one corrected, passes. And a clause after a comma is not a second answer."""
    out = []
    for gold, right, wrong in HEDGED:
        for text, style in (
            (
                f"{WORKING} The answer is ${wrong}$. The answer is $0$. The answer is ${right}$.",
                "spray_answer_is",
            ),
            (f"{WORKING}\nAnswer: ${wrong}$\nAnswer: ${right}$", "spray_answer_line"),
            (
                f"{WORKING} So $\\boxed{{{wrong}}}$. Then $\\boxed{{{right}}}$.",
                "spray_boxes_apart",
            ),
        ):
            out.append(_row("sprayed", gold, text, False, style, f"spray: {wrong} / {right}"))
        for text, style in (
            (f"{WORKING} The answer is ${right}$. So the answer is ${right}$.", "restated"),
            (
                f"{WORKING} The answer is ${wrong}$. That was a mistake: the answer is ${right}$.",
                "self_correction",
            ),
        ):
            out.append(_row("sprayed", gold, text, True, style, f"one answer: {right}"))
    for gold, text in (
        ("42", f"{WORKING} The answer is 42, the number of ways to pick them."),
        ("\\text{no}", f"{WORKING} The answer is no, there is no such number."),
    ):
        out.append(_row("sentence_comma", gold, text, True, "answer_is", "a clause, not a list"))
    return out


def main() -> None:
    written = rows()
    with OUT.open("w", encoding="utf-8") as handle:
        for row in written:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {len(written)} rows to {OUT.name}")


if __name__ == "__main__":
    main()
