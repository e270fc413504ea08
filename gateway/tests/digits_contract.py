"""What the digits model declares and what Triton answers to a wrong shape, shared by the gateway's contract tests (a
fixture module: nothing here is collected)."""

from __future__ import annotations

from modelport.core.signature import Signature, Tensor

SIGNATURE = Signature(inputs=(Tensor("input", "FP32", (-1, 64)),),
                      outputs=(Tensor("probabilities", "FP32", (-1, 10)), Tensor("label", "INT64", (-1,))))


SHAPE_ERROR = ("[request id: <id_unknown>] unexpected shape for input 'input' for model 'digits'. Expected [-1,64], "
               "got [2,63]. NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension "
               "to be prepended to each input shape. If you want to specify the full shape including the batch dim "
               "in your input dims config, try setting max_batch_size to zero. See the model configuration docs for "
               "more info on max_batch_size.")
