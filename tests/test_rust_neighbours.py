"""No Rust sample's verdict depends on its neighbours' source, however their compilation is batched.

Batched samples share one crate, and a trait impl is crate-wide: an impl of a standard trait on a
standard type (`impl PartialEq<Marker> for i64`, on the prompt's `HashMap`) is a candidate for
every comparison the crate type-checks. With many such impls rustc reports a neighbour's
`assert_eq!(got, vec![])` or `.collect()` as "type annotations needed" (E0282/E0283) without
naming the impls, so the error lies in the neighbour's files alone and was blamed on it: a correct
sample became `compile_error` (issue 37 item 5). Each attack here sits between correct neighbours
(whose tests compare with `vec![]`, `.collect()`, `Default::default()`, and one that has a trait
impl of its own), and every verdict, the attacker's too, must equal the sample's verdict compiled
alone. `test_trait_impls_reach_no_neighbour_without_routing` turns off the static routing of
foreign impls, so the attacks share the crate and only the structural defence (samples with trait
impls are batched only among themselves, and their compile errors are confirmed alone) holds.
`test_crate_global_items_change_no_verdict` covers the other crate-global items (exported
macros, lang items, a panic handler, symbols, inner attributes, type recursion...).
"""

from __future__ import annotations

from typing import Any

import pytest
from test_rust_isolation import ADD, CORRECT, WORDS

from ckpteval.checkers import Job, Verdict, get_checker
from ckpteval.checkers.rust import checker as rust_checker

#: Every test compiles Rust.
pytestmark = pytest.mark.needs("rustc")

#: Its tests compare with an empty `vec![]`: the element type comes from the one `PartialEq`
#: impl of `i64`, until a neighbour adds others.
EVENS = {
    "task_id": "evens",
    "entry_point": "evens",
    "prompt": "/// The even numbers of `v`, in order.\nfn evens(v: Vec<i64>) -> Vec<i64> {\n",
    "tests": "#[cfg(test)]\nmod tests {\n    use super::*;\n    #[test]\n    fn test_evens() {\n"
    "        assert_eq!(evens(vec![1, 3]), vec![]);\n"
    "        assert_eq!(evens(vec![1, 2, 4]), vec![2, 4]);\n    }\n}\n",
}
EVENS_OK = "    v.into_iter().filter(|x| x % 2 == 0).collect()\n}\n"
#: Correct, with a trait impl of its own (so it is batched with other samples that have trait
#: impls), and code whose inference a neighbour's impls on `i64` can break.
EVENS_OWN_IMPL = (
    "    if v == vec![] {\n        return vec![];\n    }\n"
    "    v.into_iter().filter(|x| Even(*x).clone().is()).collect()\n}\n"
    "struct Even(i64);\nimpl Clone for Even {\n    fn clone(&self) -> Self {\n        Even(self.0)\n"
    "    }\n}\nimpl Even {\n    fn is(&self) -> bool {\n        self.0 % 2 == 0\n    }\n}\n"
)
#: The prompt imports `HashMap`; the tests build the expected map with `collect()` and
#: `Default::default()`, whose types come from `HashMap`'s one `PartialEq` impl.
WORDS_COLLECT = {
    **WORDS,
    "task_id": "words_collect",
    "tests": "#[cfg(test)]\nmod tests {\n    use super::*;\n    #[test]\n    fn test_count_words() {\n"
    '        assert_eq!(count_words("a a b"), [("a".to_string(), 2), ("b".to_string(), 1)]'
    ".into_iter().collect());\n"
    '        assert_eq!(count_words(""), Default::default());\n    }\n}\n',
}
COUNT = (
    "    let mut counts = HashMap::new();\n    for w in text.split_whitespace() {\n"
    "        *counts.entry(w.to_string()).or_insert(0) += 1;\n    }\n    counts\n}\n"
)
NEIGHBOURS = [
    (EVENS, EVENS_OK),
    (WORDS_COLLECT, COUNT),
    (ADD, CORRECT),
    (EVENS, EVENS_OWN_IMPL),
]


def _many_eq(target: str, n: int = 12) -> str:
    """`n` impls of `PartialEq<Marker<i>>` for `target`: past a handful, rustc's "type
    annotations needed" in a neighbour stops naming them, so the error lies in its files only."""
    return "".join(
        f"struct Marker{i};\nimpl PartialEq<Marker{i}> for {target} {{\n"
        f"    fn eq(&self, _: &Marker{i}) -> bool {{\n        self.clone() != self.clone()\n"
        "    }\n}\n"
        for i in range(n)
    )


#: attack -> (problem, completion); each answers its problem correctly.
TRAIT_IMPL_ATTACKS: dict[str, tuple[dict[str, Any], str]] = {
    # A `struct HashMap` of its own, but inside a function: at the top level `HashMap` is the
    # prompt's import (std's), which the name check did not look at.
    "own HashMap in a function, impls on the prompt's": (
        WORDS,
        COUNT
        + "fn helper() {\n    struct HashMap;\n    let _ = HashMap;\n}\n"
        + _many_eq("HashMap<String, usize>"),
    ),
    # The impls' target is a type macro named like a struct of its own (macros and types live
    # in different namespaces): `m!()` is `i64`.
    "type macro as the impls' target": (
        ADD,
        CORRECT + "#[allow(non_camel_case_types)]\nstruct m;\n"
        "macro_rules! m {\n    () => { i64 };\n}\n" + _many_eq("m!()"),
    ),
}
#: With routing off these share the crate too (plainly foreign impls).
PLAIN_FOREIGN = {
    "impls on i64": (ADD, CORRECT + _many_eq("i64")),
    "impls on the prompt's HashMap": (WORDS, COUNT + _many_eq("HashMap<String, usize>")),
}
_PANIC_HANDLER = "#[panic_handler]\nfn on_panic(_: &std::panic::PanicInfo) -> ! {\n    loop {}\n}\n"
#: Other crate-global items a module can hold; each answers `ADD` (right or not).
GLOBAL_ITEMS = {
    "exported macros named like a neighbour's entry point": CORRECT
    + "#[macro_export]\nmacro_rules! evens {\n    () => {};\n}\n"
    "#[macro_export]\nmacro_rules! count_words {\n    () => {};\n}\n",
    "a panic handler": CORRECT + _PANIC_HANDLER,
    "a lang item": CORRECT + '#[lang = "eh_personality"]\nfn personality() {}\n',
    "a symbol named main": CORRECT + '#[export_name = "main"]\npub fn not_main() {}\n',
    "an inner attribute": '    a + b\n}\n#![recursion_limit = "4"]\n',
    "a test case for a custom runner": CORRECT + "#[test_case]\nfn case() {}\n",
    "a main of its own under cfg(test)": CORRECT + "#[cfg(test)]\nfn main() {}\n",
    "a deny lint on its own code": CORRECT
    + "#[deny(warnings)]\nfn unused() {\n    let x = 1;\n}\n",
    "type recursion": "    grow::<i64>(64);\n    a + b\n}\n"
    "fn grow<T>(n: u32) {\n    if n > 0 {\n        grow::<(T, T)>(n - 1)\n    }\n}\n",
    "endless macro recursion": CORRECT
    + "macro_rules! r {\n    () => {\n        r!();\n    };\n}\nr!();\n",
    "a blanket impl of its own trait": CORRECT
    + "trait Len {\n    fn len(&self) -> usize;\n}\nimpl<T> Len for T {\n"
    "    fn len(&self) -> usize {\n        0\n    }\n}\n",
    "a module named like the harness": CORRECT + "mod ckpteval_harness {\n    pub fn run() {}\n}\n",
}


def _key(v: Verdict) -> tuple[Any, ...]:
    return (v.passed, v.error_type, v.compile_ok)


def _check(jobs: list[Job], batch_size: int = 128) -> list[Verdict]:
    return get_checker("rust", sandbox="bwrap", batch_size=batch_size).check(
        jobs, workers=2, timeout=3
    )


def _surrounded(attacks: list[tuple[dict[str, Any], str]]) -> list[Job]:
    """Each attack with every neighbour on both sides; one worker's batches hold them all."""
    around = [Job(p["task_id"], p, c) for p, c in NEIGHBOURS]
    jobs = list(around)
    for problem, completion in attacks:
        jobs += [Job(problem["task_id"], problem, completion), *around]
    return jobs


def _assert_as_alone(jobs: list[Job], batch_size: int = 128) -> None:
    """Every verdict batched equals the verdict of that sample compiled alone, every correct
    neighbour passes."""
    distinct = list({(j.task_id, j.completion): j for j in jobs}.values())
    alone = {(j.task_id, j.completion): v for j, v in zip(distinct, _check(distinct, batch_size=1))}
    neighbours = {(p["task_id"], c) for p, c in NEIGHBOURS}
    assert all(alone[k].passed for k in neighbours), alone
    batched = _check(jobs, batch_size)
    wrong = [
        f"#{i} {job.task_id}: batched {v}, alone {alone[(job.task_id, job.completion)]}"
        for i, (job, v) in enumerate(zip(jobs, batched, strict=True))
        if _key(v) != _key(alone[(job.task_id, job.completion)])
    ]
    assert not wrong, "\n".join(wrong)


def test_trait_impls_of_a_neighbour_change_no_verdict() -> None:
    _assert_as_alone(_surrounded(list(TRAIT_IMPL_ATTACKS.values())))


def test_trait_impls_reach_no_neighbour_without_routing(monkeypatch: pytest.MonkeyPatch) -> None:
    """With foreign impls no longer sent to compile alone, they share a crate with samples that
    have trait impls of their own; those samples' compile errors are confirmed alone, and samples
    without trait impls never share a crate with any."""
    monkeypatch.setattr(rust_checker, "_foreign_impls", lambda text: False)
    attacks = [*TRAIT_IMPL_ATTACKS.values(), *PLAIN_FOREIGN.values()]
    jobs = _surrounded(attacks)
    units = [rust_checker._make_unit(i, job, 3.0) for i, job in enumerate(jobs)]
    assert not any(u.alone_only for u in units), "every sample must be batched"
    _assert_as_alone(jobs)


def test_crate_global_items_change_no_verdict() -> None:
    exported = GLOBAL_ITEMS["exported macros named like a neighbour's entry point"]
    attacks = [(ADD, c) for c in GLOBAL_ITEMS.values()] + [(ADD, exported)]  # the same name twice
    _assert_as_alone(_surrounded(attacks))


def test_trait_impl_detection() -> None:
    """What counts as a trait impl (batched apart): `impl X for Y`, also through a macro's
    arguments; not inherent impls, `impl Trait` in a signature or `for` loops."""
    has = [
        "impl Clone for Even {}",
        "impl<T> Len for T {}",
        "macro_rules! m { ($t:ty) => { impl Clone for $t {} }; }",
        "macro_rules! m { ($($x:tt)*) => { impl $($x)* }; }\nm!(Clone for Even {});",
    ]
    has_not = [
        "impl Even {\n    fn is(&self) -> bool { for _ in 0..1 {} true }\n}",
        "fn f(x: impl Iterator<Item = i64>) -> impl Iterator<Item = i64> {\n    for _ in 0..1 {}\n    x\n}",
        '// impl Clone for Even {}\nfn f() -> &\'static str { "impl Clone for Even" }',
    ]
    assert [rust_checker._trait_impls(t) for t in has] == [True] * len(has)
    assert [rust_checker._trait_impls(t) for t in has_not] == [False] * len(has_not)
    # A problem's tests are in the crate too: an impl there counts for each of its samples.
    tests_impl = {
        **EVENS,
        "tests": EVENS["tests"] + "struct W;\nimpl Clone for W {\n"
        "    fn clone(&self) -> Self {\n        W\n    }\n}\n",
    }
    assert rust_checker._make_unit(0, Job("evens", tests_impl, EVENS_OK), 3.0).trait_impls
    assert not rust_checker._make_unit(0, Job("evens", EVENS, EVENS_OK), 3.0).trait_impls
