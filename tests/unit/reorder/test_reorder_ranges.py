"""reorder.ranges.RangeMap against a brute-force model: a dict of one entry per integer (issue 24 item 3)."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from reorder.ranges import RangeMap

SMALL = st.integers(min_value=0, max_value=60)
VALUE = st.integers(min_value=0, max_value=2)

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), SMALL, SMALL, VALUE),
        st.tuples(st.just("pop"), SMALL),
        st.tuples(st.just("pop_range"), SMALL, SMALL),
        st.tuples(st.just("trim_low"), st.integers(min_value=0, max_value=40)),
        st.tuples(st.just("drop_first_ranges"), st.integers(min_value=0, max_value=8)),
        st.tuples(st.just("drop_below"), SMALL),
    ),
    max_size=60,
)


def _check(ranges: RangeMap[int], model: dict[int, int]) -> None:
    pieces = list(ranges)
    expanded = {x: v for lo, hi, v in pieces for x in range(lo, hi + 1)}
    assert expanded == model
    assert ranges.count == len(model)
    for (_lo1, hi1, v1), (lo2, _hi2, v2) in pairwise(pieces):
        assert hi1 < lo2  # sorted and disjoint
        assert not (hi1 + 1 == lo2 and v1 == v2)  # equal neighbours are merged
    for x in range(-1, 63):
        assert (x in ranges) == (x in model)
        assert ranges.get(x) == model.get(x)
        span = ranges.span(x)
        assert (span is not None) == (x in model)
        if span is not None:
            assert any(lo == span[0] and hi == span[1] for lo, hi, _v in pieces) and span[0] <= x <= span[1]
    assert ranges.gaps(0, 61) == _model_gaps(model, 0, 61)


def _model_gaps(model: dict[int, int], lo: int, hi: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for x in range(lo, hi + 1):
        if x in model:
            continue
        if out and out[-1][1] == x - 1:
            out[-1] = (out[-1][0], x)
        else:
            out.append((x, x))
    return out


@settings(max_examples=400, deadline=None)
@given(OPS)
def test_range_map_matches_a_per_integer_dict(ops: list[tuple[object, ...]]) -> None:
    ranges: RangeMap[int] = RangeMap()
    model: dict[int, int] = {}
    for op in ops:
        name = op[0]
        if name == "add":
            a, b, v = op[1], op[2], op[3]
            assert isinstance(a, int) and isinstance(b, int) and isinstance(v, int)
            ranges.add(a, b, v)
            model.update(dict.fromkeys(range(a, b + 1), v))
        elif name == "pop":
            x = op[1]
            assert isinstance(x, int)
            assert ranges.pop(x) == model.pop(x, None)
        elif name == "pop_range":
            a, b = op[1], op[2]
            assert isinstance(a, int) and isinstance(b, int)
            removed = ranges.pop_range(a, b)
            expected = {x: model.pop(x) for x in range(a, b + 1) if x in model}
            assert {x: v for lo, hi, v in removed for x in range(lo, hi + 1)} == expected
            assert [lo for lo, _hi, _v in removed] == sorted(lo for lo, _hi, _v in removed)
        elif name == "trim_low":
            limit = op[1]
            assert isinstance(limit, int)
            excess = max(0, len(model) - limit)
            for x in sorted(model)[:excess]:
                del model[x]
            assert ranges.trim_low(limit) == excess
        elif name == "drop_first_ranges":
            limit = op[1]
            assert isinstance(limit, int)
            pieces = list(ranges)
            dropped = pieces[:max(0, len(pieces) - limit)]
            for lo, hi, _v in dropped:
                for x in range(lo, hi + 1):
                    del model[x]
            assert ranges.drop_first_ranges(limit) == sum(hi - lo + 1 for lo, hi, _v in dropped)
            assert len(ranges) == min(limit, len(pieces))
        else:
            x = op[1]
            assert isinstance(x, int)
            ranges.drop_below(x)
            for y in [y for y in model if y < x]:
                del model[y]
        _check(ranges, model)


def test_a_jump_of_a_million_is_one_range() -> None:
    ranges: RangeMap[int] = RangeMap()
    ranges.add(1, 999_999, 7)
    assert (len(ranges), ranges.count) == (1, 999_999)
    assert ranges.pop(500_000) == 7
    assert (len(ranges), ranges.count) == (2, 999_998)
    assert ranges.pop_range(0, 1_000_000) == [(1, 499_999, 7), (500_001, 999_999, 7)]
    assert (len(ranges), ranges.count) == (0, 0)
