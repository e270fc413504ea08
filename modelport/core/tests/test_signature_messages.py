"""A signature's bad value is named with the valid ones, never dropped or guessed: "FLOAT32" was dropped by the
upload page's import and came back as "unknown datatype ''", and an output without dims became -1."""

from __future__ import annotations

import pytest

from modelport.core.signature import SignatureError, parse_signature


def tensor(**fields: object) -> dict[str, object]:
    return {"name": "y", "datatype": "FP32", "dims": [-1, 3], **fields}


def refusal(outputs: list[dict[str, object]]) -> str:
    with pytest.raises(SignatureError) as caught:
        parse_signature({"inputs": [{"name": "x", "datatype": "FP32", "dims": [-1, 4]}], "outputs": outputs})
    return str(caught.value)


def test_an_unknown_datatype_is_named_with_the_valid_ones() -> None:
    text = refusal([tensor(datatype="FLOAT32")])
    assert text.startswith("signature.outputs[0] (y): unknown datatype 'FLOAT32': use one of BOOL, UINT8")
    assert "FP32" in text and "TYPE_*" in text


@pytest.mark.parametrize("value", [None, ""])
def test_a_missing_datatype_says_missing_not_unknown_empty(value: object) -> None:
    fields = {"datatype": value} if value is not None else {}
    raw = {"name": "y", "dims": [-1, 3], **fields}
    text = refusal([raw])
    assert "datatype is missing: use one of BOOL" in text
    assert "''" not in text


def test_an_output_without_dims_is_refused_not_made_dynamic() -> None:
    text = refusal([{"name": "y", "datatype": "FP32"}])
    assert text == ("signature.outputs[0] (y): dims are missing: give the full shape, -1 for a dynamic dimension, "
                    "e.g. [-1, 3, 224, 224]")


def test_a_datatype_of_the_wrong_type_lists_the_valid_ones_too() -> None:
    assert "got 32: use one of BOOL" in refusal([tensor(datatype=32)])


def test_triton_and_lowercase_names_still_parse() -> None:
    signature = parse_signature({"inputs": [{"name": "x", "datatype": "TYPE_FP32", "dims": [-1, 4]}],
                                 "outputs": [{"name": "y", "datatype": " int64 ", "dims": [1]}]})
    assert [t.datatype for t in signature.inputs + signature.outputs] == ["FP32", "INT64"]
