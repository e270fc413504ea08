"""Artifacts of each format built by hand for the registry's tests (a fixture module: nothing here is collected)."""

from __future__ import annotations

import zipfile
from pathlib import Path

TRITON_MODEL_PY = (
    b"import numpy as np\n\n\nclass TritonPythonModel:\n    def execute(self, requests):\n        return []\n"
)


def zip_of(path: Path, entries: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return path


def torchscript_entries(top: str = "model") -> dict[str, bytes]:
    """The records torch.jit.save writes (the pickles' content does not matter to detection)."""
    return {
        f"{top}/data.pkl": b"\x80\x02}q\x00.",
        f"{top}/constants.pkl": b"\x80\x02).",
        f"{top}/code/__torch__/model.py": b"class Model(Module):\n  pass\n",
        f"{top}/version": b"3\n",
        f"{top}/.data/version": b"3\n",
    }
