"""The one datatype table: every name a datatype goes by agrees with the library that defines it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto
from tritonclient.grpc import model_config_pb2 as mc

from modelport.core import datatypes
from modelport.core.formats.onnx_inspect import ONNX_TO_KSERVE
from modelport.core.formats.savedmodel_inspect import _TF_DATATYPES


def test_each_name_is_unique_in_every_column() -> None:
    for column in ("kserve", "triton", "onnx", "tensorflow"):
        names = [getattr(d, column) for d in datatypes.DATATYPES]
        assert len(names) == len(set(names)), column


@pytest.mark.parametrize("datatype", datatypes.DATATYPES, ids=lambda d: d.kserve)
def test_the_names_are_those_the_libraries_define(datatype: datatypes.Datatype) -> None:
    mc.DataType.Value(datatype.triton)  # raises for a name Triton's config does not know
    TensorProto.DataType.Value(datatype.onnx)
    assert datatype.tensorflow in _TF_DATATYPES
    if datatype.numpy is not None:
        dtype = np.dtype(datatype.numpy)
        if datatype.kind != "bytes":
            assert dtype.itemsize == datatype.size


def test_inspection_maps_onnx_types_through_the_table() -> None:
    assert ONNX_TO_KSERVE[TensorProto.FLOAT] == "FP32"
    assert ONNX_TO_KSERVE[TensorProto.STRING] == "BYTES"
    assert TensorProto.COMPLEX64 not in ONNX_TO_KSERVE  # Triton cannot serve it


def test_the_form_offers_every_datatype_once_with_fp32_first() -> None:
    assert sorted(datatypes.FORM_ORDER) == sorted(datatypes.BY_KSERVE)
    assert datatypes.FORM_ORDER[:4] == ("FP32", "FP16", "FP64", "BF16")
    assert datatypes.FORM_ORDER[-2:] == ("BOOL", "BYTES")
