"""The worker's parse of contract records (spark_jobs.record_columns) against Spark's own.

The expected columns of :data:`TABLE` are what Spark 4.0.0's ``from_json`` (PERMISSIVE, the contract schema: the
CEP jobs' parse before it moved into the Python worker) returned for each value, collected once from a local session
(null columns left out; a payload as Spark's JSON text of it)."""

from typing import Any

import orjson
import pytest

from spark_jobs.record_columns import COLUMN_TYPES, java_double_text, json_text, parse_record, record_columns
from spark_jobs.stateful import decode_payload

FULL_EVENT = (b'{"v":2,"kind":"event","stream":"s","source_id":"src-1","seq":7,"source_ts_us":10,"ref_ts_us":11,'
              b'"uncertainty_us":500,"arrival_ts_us":12,"release_ts_us":13,"late":true,"late_reason":"duplicate",'
              b'"lateness_us":4,"watermark_us":3,"rtt_us":900,'
              b'"payload":{"type":"A","id":1,"value":1.5,"n":{"x":[1,2.5]}},"start_ts_us":9,"end_ts_us":11,'
              b'"start_uncertainty_us":6,"source_start_ts_us":8,"interval_id":"i1","endpoint":"start"}')
TABLE: list[tuple[str, bytes | None, dict[str, Any]]] = [
    ('full event', FULL_EVENT,
     {'v': 2,
      'kind': 'event',
      'stream': 's',
      'source_id': 'src-1',
      'seq': 7,
      'source_ts_us': 10,
      'ref_ts_us': 11,
      'uncertainty_us': 500,
      'arrival_ts_us': 12,
      'release_ts_us': 13,
      'late': True,
      'late_reason': 'duplicate',
      'lateness_us': 4,
      'watermark_us': 3,
      'rtt_us': 900,
      'payload': '{"type":"A","id":1,"value":1.5,"n":{"x":[1,2.5]}}',
      'start_ts_us': 9,
      'end_ts_us': 11,
      'start_uncertainty_us': 6,
      'source_start_ts_us': 8,
      'interval_id': 'i1',
      'endpoint': 'start'}),
    ('punctuation', b'{"v":2,"kind":"punctuation","stream":"s","watermark_us":5,"release_ts_us":6}',
     {'v': 2, 'kind': 'punctuation', 'stream': 's', 'release_ts_us': 6, 'watermark_us': 5}),
    ('kafka null', None,
     {}),
    ('empty', b'',
     {}),
    ('whitespace', b'  ',
     {}),
    ('not json', b'not json',
     {}),
    ('truncated', b'{"stream":"s","kind":"event","ref_ts_us":1',
     {}),
    ('array of objects', b'[{"stream":"s","kind":"event","ref_ts_us":1}]',
     {}),
    ('empty array', b'[]',
     {}),
    ('number', b'5',
     {}),
    ('string', b'"s"',
     {}),
    ('json null', b'null',
     {}),
    ('missing fields', b'{"stream":"s"}',
     {'stream': 's'}),
    ('explicit nulls',
     b'{"stream":"s","kind":"event","ref_ts_us":null,"seq":null,"late":null,"payload":null,"source_id":null}',
     {'kind': 'event', 'stream': 's'}),
    ('long as string', b'{"stream":"s","kind":"event","ref_ts_us":1,"seq":"3"}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1}),
    ('long as float', b'{"stream":"s","kind":"event","ref_ts_us":1.0,"seq":3.5}',
     {'kind': 'event', 'stream': 's'}),
    ('long as exponent', b'{"stream":"s","kind":"event","ref_ts_us":1e2}',
     {'kind': 'event', 'stream': 's'}),
    ('long as bool', b'{"stream":"s","kind":"event","ref_ts_us":1,"seq":true}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1}),
    ('long as object', b'{"stream":"s","kind":"event","ref_ts_us":1,"seq":{"a":1}}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1}),
    ('long max', b'{"stream":"s","kind":"event","ref_ts_us":9223372036854775807,"seq":-9223372036854775808}',
     {'kind': 'event', 'stream': 's', 'seq': -9223372036854775808, 'ref_ts_us': 9223372036854775807}),
    ('long overflow', b'{"stream":"s","kind":"event","ref_ts_us":1,"seq":9223372036854775808}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1}),
    ('long negative overflow', b'{"stream":"s","kind":"event","ref_ts_us":1,"seq":-9223372036854775809}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1}),
    ('long past u64', b'{"stream":"s","kind":"event","ref_ts_us":1,"seq":18446744073709551616}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1}),
    ('huge int', b'{"stream":"s","kind":"event","ref_ts_us":1,"seq":123456789012345678901234567890}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1}),
    ('negative zero', b'{"stream":"s","kind":"event","ref_ts_us":-0,"seq":0}',
     {'kind': 'event', 'stream': 's', 'seq': 0, 'ref_ts_us': 0}),
    ('float overflow', b'{"stream":"s","kind":"event","ref_ts_us":1,"seq":1e400}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1}),
    ('NaN long', b'{"stream":"s","kind":"event","ref_ts_us":NaN}',
     {'kind': 'event', 'stream': 's'}),
    ('Infinity long', b'{"stream":"s","kind":"event","ref_ts_us":1,"seq":-Infinity}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1}),
    ('bool as string', b'{"stream":"s","kind":"event","ref_ts_us":1,"late":"true"}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1}),
    ('bool as number', b'{"stream":"s","kind":"event","ref_ts_us":1,"late":1}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1}),
    ('bool false', b'{"stream":"s","kind":"event","ref_ts_us":1,"late":false}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1, 'late': False}),
    ('string as number', b'{"stream":"s","kind":"event","ref_ts_us":1,"source_id":5}',
     {'kind': 'event', 'stream': 's', 'source_id': '5', 'ref_ts_us': 1}),
    ('string as float', b'{"stream":"s","kind":"event","ref_ts_us":1,"source_id":1.5}',
     {'kind': 'event', 'stream': 's', 'source_id': '1.5', 'ref_ts_us': 1}),
    ('string as bool', b'{"stream":"s","kind":"event","ref_ts_us":1,"source_id":false}',
     {'kind': 'event', 'stream': 's', 'source_id': 'false', 'ref_ts_us': 1}),
    ('string as object', b'{"stream":"s","kind":"event","ref_ts_us":1,"source_id":{"a": [1, "x"]}}',
     {'kind': 'event', 'stream': 's', 'source_id': '{"a":[1,"x"]}', 'ref_ts_us': 1}),
    ('string empty', b'{"stream":"s","kind":"event","ref_ts_us":1,"source_id":""}',
     {'kind': 'event', 'stream': 's', 'source_id': '', 'ref_ts_us': 1}),
    ('string escapes', b'{"stream":"s","kind":"event","ref_ts_us":1,"source_id":"\\u00e9\\n\\"x\\"\\/"}',
     {'kind': 'event', 'stream': 's', 'source_id': 'é\n"x"/', 'ref_ts_us': 1}),
    ('string unicode',
     b'{"stream":"s","kind":"event","ref_ts_us":1,"source_id":"\xc3\xa9\xe6\xbc\xa2\xf0\x9f\x98\x80"}',
     {'kind': 'event', 'stream': 's', 'source_id': 'é漢😀', 'ref_ts_us': 1}),
    ('long empty string', b'{"stream":"s","kind":"event","ref_ts_us":1,"seq":""}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1}),
    ('payload string json', b'{"stream":"s","kind":"event","ref_ts_us":1,"payload":"{\\"type\\":\\"A\\",\\"id\\":2}"}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1, 'payload': '{"type":"A","id":2}'}),
    ('payload string', b'{"stream":"s","kind":"event","ref_ts_us":1,"payload":"abc"}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1, 'payload': 'abc'}),
    ('payload empty string', b'{"stream":"s","kind":"event","ref_ts_us":1,"payload":""}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1, 'payload': ''}),
    ('payload list', b'{"stream":"s","kind":"event","ref_ts_us":1,"payload":[1,"a",true,null]}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1, 'payload': '[1,"a",true,null]'}),
    ('payload number', b'{"stream":"s","kind":"event","ref_ts_us":1,"payload":5}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1, 'payload': '5'}),
    ('payload float', b'{"stream":"s","kind":"event","ref_ts_us":1,"payload":2.5}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1, 'payload': '2.5'}),
    ('payload bool', b'{"stream":"s","kind":"event","ref_ts_us":1,"payload":true}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1, 'payload': 'true'}),
    ('payload empty object', b'{"stream":"s","kind":"event","ref_ts_us":1,"payload":{}}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1, 'payload': '{}'}),
    ('payload huge int', b'{"stream":"s","kind":"event","ref_ts_us":1,"payload":{"id":123456789012345678901234567890}}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1, 'payload': '{"id":123456789012345678901234567890}'}),
    ('payload floats',
     b'{"stream":"s","kind":"event","ref_ts_us":1,"payload":{"a":1e20,"b":0.1,"c":-0.0,"d":1E-7,"e":100}}',
     {'kind': 'event',
      'stream': 's',
      'ref_ts_us': 1,
      'payload': '{"a":1.0E20,"b":0.1,"c":-0.0,"d":1.0E-7,"e":100}'}),
    ('payload float overflow', b'{"stream":"s","kind":"event","ref_ts_us":1,"payload":{"a":1e400}}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1, 'payload': '{"a":"Infinity"}'}),
    ('payload NaN', b'{"stream":"s","kind":"event","ref_ts_us":1,"payload":{"a":NaN}}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1, 'payload': '{"a":"NaN"}'}),
    ('payload nested', b'{"stream":"s","kind":"event","ref_ts_us":1,"payload":{"a":{"b":[{"c":null}]},"s":"\\u00e9"}}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1, 'payload': '{"a":{"b":[{"c":null}]},"s":"é"}'}),
    ('stream as number', b'{"stream":5,"kind":"event","ref_ts_us":1}',
     {'kind': 'event', 'stream': '5', 'ref_ts_us': 1}),
    ('kind unknown', b'{"stream":"s","kind":"other","ref_ts_us":1}',
     {'kind': 'other', 'stream': 's', 'ref_ts_us': 1}),
    ('unknown fields', b'{"stream":"s","kind":"event","ref_ts_us":1,"extra":{"deep":[1,2,{"x":"y"}]},"z":null}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1}),
    ('trailing garbage', b'{"stream":"s","kind":"event","ref_ts_us":1} trailing',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1}),
    ('two objects', b'{"stream":"s","kind":"event","ref_ts_us":1}{"stream":"t"}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1}),
    ('leading whitespace', b' \n\t{"stream":"s","kind":"event","ref_ts_us":1}',
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1}),
    ('duplicate key', b'{"stream":"s","kind":"event","ref_ts_us":1,"seq":1,"seq":2}',
     {'kind': 'event', 'stream': 's', 'seq': 2, 'ref_ts_us': 1}),
    ('single quotes', b"{'stream':'s','kind':'event','ref_ts_us':1}",
     {'kind': 'event', 'stream': 's', 'ref_ts_us': 1}),
    ('unquoted control char', b'{"stream":"s","kind":"event","ref_ts_us":1,"source_id":"a\tb"}',
     {}),
    ('invalid utf-8', b'{"stream":"s","kind":"event","ref_ts_us":1,"source_id":"\xff"}',
     {'kind': 'event', 'stream': 's', 'source_id': '�', 'ref_ts_us': 1}),
    ('bad field after good', b'{"stream":"s","kind":"event","ref_ts_us":1,"seq":2,"payload":{"a":1},"rtt_us":"x"}',
     {'kind': 'event', 'stream': 's', 'seq': 2, 'ref_ts_us': 1, 'payload': '{"a":1}'}),
]
# Spark's reader takes single-quoted strings; the worker's does not (not JSON): such a value is not a record.
NOT_FOLLOWED = {"single quotes"}


def payload_verdict(payload: Any) -> tuple[str, Any]:
    """What a core gets of a payload: the object, or the error it reports (``bad_payload``)."""
    try:
        return "object", decode_payload(payload)
    except ValueError as exc:
        return "error", str(exc)


def test_every_column_has_spark_s_verdict_on_the_table() -> None:
    names = list(COLUMN_TYPES)
    columns = record_columns([value for _case, value, _spark in TABLE], names)
    for i, (case, _value, spark) in enumerate(TABLE):
        if case in NOT_FOLLOWED:
            continue
        mine = {name: columns[name][i] for name in names if name != "payload" and columns[name][i] is not None}
        assert mine == {name: v for name, v in spark.items() if name != "payload"}, case
        assert payload_verdict(columns["payload"][i]) == payload_verdict(spark.get("payload")), case


def test_a_value_alone_gets_the_verdict_it_gets_among_others() -> None:
    """A column whose values are all of its type is kept as it is (C-level checks); one value of another type
    sends the column through a check per value: both give the same verdicts."""
    names = list(COLUMN_TYPES)
    together = record_columns([value for _case, value, _spark in TABLE], names)
    for i, (case, value, _spark) in enumerate(TABLE):
        alone = record_columns([value, FULL_EVENT], names)
        assert {name: column[0] for name, column in alone.items()} == \
            {name: column[i] for name, column in together.items()}, case


def test_the_table_has_each_kind_of_verdict() -> None:
    """The table is not all-good: values with no columns, with partial columns, and each payload verdict."""
    spark_payloads = [payload_verdict(spark.get("payload"))[0] for _c, _v, spark in TABLE if "payload" in spark]
    assert sum(1 for _c, _v, spark in TABLE if not spark) >= 10
    assert {"object", "error"} <= set(spark_payloads)


def test_a_single_quoted_value_is_not_a_record_for_the_worker() -> None:
    value = next(v for case, v, _spark in TABLE if case == "single quotes")
    assert parse_record(value) is None


def test_only_the_asked_columns_are_made() -> None:
    columns = record_columns([FULL_EVENT, b"[]"], ["seq", "payload"])
    assert columns == {"seq": [7, None], "payload": [{"type": "A", "id": 1, "value": 1.5, "n": {"x": [1, 2.5]}},
                                                     None]}


@pytest.mark.parametrize(("value", "text"), [
    (0.1, "0.1"), (100.0, "100.0"), (1e20, "1.0E20"), (1e-7, "1.0E-7"), (-0.0, "-0.0"), (0.0, "0.0"),
    (1e7, "1.0E7"), (9999999.0, "9999999.0"), (0.001, "0.001"), (0.0001, "1.0E-4"), (123456.789, "123456.789"),
    (1.5e300, "1.5E300"), (-2.5e-5, "-2.5E-5"), (12.0, "12.0"), (0.0123, "0.0123"),
])
def test_doubles_print_as_java_prints_them(value: float, text: str) -> None:
    assert java_double_text(value) == text


def test_json_text_is_spark_s_text_of_a_value() -> None:
    # Spark's payload column held these texts for the table's payloads (compact, doubles as Java prints them).
    assert json_text({"a": 1e20, "b": [1, "x", True, None], "c": {"d": -0.0}}) == \
        '{"a":1.0E20,"b":[1,"x",true,null],"c":{"d":-0.0}}'
    assert json_text("\u00e9\n") == orjson.dumps("\u00e9\n").decode()
