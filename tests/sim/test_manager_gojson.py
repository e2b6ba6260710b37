"""The sim manager's JSON as Go's encoding/json writes and reads it (pure functions)."""

from __future__ import annotations

import pytest

from cuzk_supervisor.sim.manager.gojson import BadJSON, decode_struct, go_dumps, go_float


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (30.0, "30"),
        (41.5, "41.5"),
        (0.1, "0.1"),
        (-0.0, "-0"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1e-6, "0.000001"),
        (1e-7, "1e-7"),
        (1.5e-7, "1.5e-7"),
        (123456789.125, "123456789.125"),
        (5e-324, "5e-324"),
    ],
)
def test_floats_as_go_prints_them(value: float, text: str) -> None:
    assert go_float(value) == text


def test_strings_escape_html_and_line_separators_as_go() -> None:
    assert go_dumps({"a": "<b>&\u2028é", "n": [1, 2.0, None, True]}) == (
        '{"a":"\\u003cb\\u003e\\u0026\\u2028é","n":[1,2,null,true]}'
    )


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (b"", "EOF"),
        (b"  \n", "EOF"),
        (b'{"label":', "unexpected EOF"),
        (b"nope", "invalid character 'o' in literal null (expecting 'u')"),
        (b"{x}", "invalid character 'x' looking for beginning of object key string"),
        (b'{"label" 1}', "invalid character '1' after object key"),
        (b'{"label": NaN}', "invalid character 'N' looking for beginning of value"),
        (b"[]", "json: cannot unmarshal array into Go value of type main.RegisterReq"),
        (b'{"label": 5}',
         "json: cannot unmarshal number into Go struct field RegisterReq.label of type string"),
        (b'{"min_rate": "x"}',
         "json: cannot unmarshal string into Go struct field RegisterReq.min_rate of type "
         "float64"),
        (b'{"min_rate": 1e999}',
         "json: cannot unmarshal number 1e999 into Go struct field RegisterReq.min_rate of "
         "type float64"),
    ],
)  # fmt: skip
def test_decode_errors_are_gos(raw: bytes, error: str) -> None:
    with pytest.raises(BadJSON) as caught:
        decode_struct(raw, "RegisterReq", {"label": str, "min_rate": float})
    assert str(caught.value) == error


def test_decode_like_go_into_a_struct() -> None:
    fields = {"label": str, "min_rate": float, "vast_id": int}
    assert decode_struct(b'{"LABEL": "C.1", "min_rate": 3} trailing', "R", fields) == {
        "label": "C.1",
        "min_rate": 3.0,
    }
    assert decode_struct(b'{"label": null, "vast_id": 12}', "R", fields) == {"vast_id": 12}
    assert decode_struct(b"null", "R", fields) == {}
    with pytest.raises(BadJSON, match=r"number 1\.5 into Go struct field R\.vast_id of type int"):
        decode_struct(b'{"vast_id": 1.5}', "R", fields)
