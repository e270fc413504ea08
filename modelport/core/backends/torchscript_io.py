"""How Modelport calls a TorchScript module: one convention for serving and for the trial run at inspection.

Used by the generated python-backend model (torchscript_python_model.py, copied beside it as this file) and by
torchscript_probe.py, which inspection runs in the runtime env; so a model that passed its trial run is called
the same way when it serves. Needs torch and numpy only.

- Inputs: by keyword when the signature's input names are exactly the names of forward()'s arguments, else by
  position in the signature's order.
- Outputs: a tensor is the only output; a tuple or list gives the outputs in the signature's order; a dict gives
  them by name.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class CallError(ValueError):
    """The module cannot be called with the signature, or returned something that does not fit it."""


def set_threads(threads: int) -> None:
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass  # only settable before the first parallel work in the process; then it is already set


def load(path: str) -> Any:
    module = torch.jit.load(path, map_location="cpu")
    module.eval()
    return module


def forward_arguments(module: Any) -> tuple[list[str], int]:
    """forward()'s argument names without `self`, and how many of them have no default."""
    arguments = list(module.forward.schema.arguments)[1:]
    return [a.name for a in arguments], sum(1 for a in arguments if not a.has_default_value())


def by_keyword(module: Any, input_names: list[str]) -> bool:
    """How to pass the inputs; CallError when neither way fits forward()."""
    names, required = forward_arguments(module)
    if set(names) == set(input_names):
        return True
    if required <= len(input_names) <= len(names):
        return False
    raise CallError(
        f"forward() takes the arguments ({', '.join(names)}) but the signature declares the inputs "
        f"({', '.join(input_names)}): declare them under forward()'s argument names, or one input per argument"
    )


def _tensor(array: np.ndarray) -> torch.Tensor:
    # torch.from_numpy shares memory and warns on read-only arrays (Triton's inputs are); copy only those.
    return torch.from_numpy(array if array.flags.writeable else array.copy())


def call(module: Any, keyword: bool, input_names: list[str], output_names: list[str],
         feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    tensors = [_tensor(feed[name]) for name in input_names]
    with torch.inference_mode():
        result = module(**dict(zip(input_names, tensors, strict=True))) if keyword else module(*tensors)
    return name_outputs(result, output_names)


def name_outputs(result: Any, output_names: list[str]) -> dict[str, np.ndarray]:
    if isinstance(result, torch.Tensor):
        values: list[Any] = [result]
        if len(output_names) != 1:
            raise CallError(f"the model returned one tensor but the signature declares {len(output_names)} outputs")
        named = dict(zip(output_names, values, strict=True))
    elif isinstance(result, dict):
        if set(result) != set(output_names):
            raise CallError(
                f"the model returned the outputs {sorted(map(str, result))} but the signature declares "
                f"{sorted(output_names)}"
            )
        named = dict(result)
    elif isinstance(result, (tuple, list)):
        if len(result) != len(output_names):
            raise CallError(
                f"the model returned {len(result)} values but the signature declares {len(output_names)} outputs"
            )
        named = dict(zip(output_names, result, strict=True))
    else:
        raise CallError(f"the model returned {type(result).__name__}: return a tensor, a tuple of tensors or a dict")
    arrays = {}
    for name in output_names:
        value = named[name]
        if not isinstance(value, torch.Tensor):
            raise CallError(f"output '{name}' is {type(value).__name__}, not a tensor")
        arrays[name] = value.detach().cpu().numpy()
    return arrays
