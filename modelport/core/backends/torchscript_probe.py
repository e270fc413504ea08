"""Trial run of an uploaded TorchScript file, inside the runtime env: load it, call it once, report what came out.

    python -I torchscript_probe.py MODEL.pt '{"inputs": [{"name", "dtype", "shape"}], "outputs": [names]}' \
        --result RESULT.json

Inspection starts it (modelport.core.trial_run, through modelport.core.frameworks.run_in_runtime_env, which limits
its time and memory): the artifact is untrusted, so it never loads in the portal's own processes. It feeds zeros of
the given shapes and dtypes, called the way the serving wrapper calls the module (torchscript_io), and writes
{"outputs": {name: {"dtype", "shape"}}} or {"error": {"stage", "type", "message"}} to the result file. Judging the
outputs against the declared signature is the portal's job, and so is bounding the error: the model runs in this
process and can write anything to the result file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# torchscript_io lies beside this file; python -I leaves the script's directory off sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parent))


def probe(model_path: str, plan: dict) -> dict:  # type: ignore[type-arg]
    import numpy as np
    import torchscript_io

    torchscript_io.set_threads(1)
    try:
        module = torchscript_io.load(model_path)
    except Exception as exc:  # noqa: BLE001 - whatever torch.jit.load raises is the user's answer
        return _error("load", exc)
    names = [str(item["name"]) for item in plan["inputs"]]
    try:
        keyword = torchscript_io.by_keyword(module, names)
    except torchscript_io.CallError as exc:
        return _error("signature", exc)
    feed = {str(item["name"]): np.zeros([int(d) for d in item["shape"]], dtype=str(item["dtype"]))
            for item in plan["inputs"]}
    try:
        outputs = torchscript_io.call(module, keyword, names, [str(n) for n in plan["outputs"]], feed)
    except torchscript_io.CallError as exc:
        return _error("signature", exc)
    except Exception as exc:  # noqa: BLE001
        return _error("call", exc)
    return {"outputs": {name: {"dtype": str(array.dtype), "shape": list(array.shape)}
                        for name, array in outputs.items()}}


def _error(stage: str, exc: BaseException) -> dict:  # type: ignore[type-arg]
    return {"error": {"stage": stage, "type": type(exc).__name__, "message": str(exc)[-4096:]}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("plan")
    parser.add_argument("--result", required=True)
    args = parser.parse_args()
    answer = probe(args.model, json.loads(args.plan))
    Path(args.result).write_text(json.dumps(answer), encoding="utf-8")


if __name__ == "__main__":
    main()
