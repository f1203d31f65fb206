"""cep/query_ast.py: the equality classes of the ``=`` predicates, on a hand-computed example."""

from __future__ import annotations

from cep.query_ast import AttrRef, Predicate, equality_classes


def test_equality_classes_join_through_shared_attributes_and_ignore_other_predicates() -> None:
    a, b, c, d = AttrRef("a", "id"), AttrRef("b", "id"), AttrRef("c", "id"), AttrRef("d", "x")
    predicates = [
        Predicate(a, "=", c),
        Predicate(d, "<", a),  # not an equality
        Predicate(c, "=", b),  # joins b to a's class through c
        Predicate(d, "=", 3),  # a constant: no class
        Predicate(d, "=", AttrRef("e", "x")),
    ]
    assert sorted(map(frozenset, equality_classes(predicates)), key=len) == [frozenset({d, AttrRef("e", "x")}),
                                                                               frozenset({a, b, c})]
    assert equality_classes([]) == []
