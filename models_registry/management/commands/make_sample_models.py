from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = ("Write the sample models (digits.onnx, resnet.onnx, preprocess.zip, postprocess.zip) and the pipeline "
            "digits-pipeline.json, with samples.json and README.md, into DIR.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("directory", metavar="DIR", type=Path)

    def handle(self, *args: Any, **options: Any) -> None:
        # Imported here: scikit-learn takes a second to import, and other commands should not pay for it.
        from models_registry.samples import write_samples

        directory: Path = options["directory"]
        if directory.exists() and not directory.is_dir():
            raise CommandError(f"{directory} exists and is not a directory")
        for sample in write_samples(directory):
            tensors = ", ".join(
                f"{t.name} {t.datatype}{list(t.dims)}" for t in sample.signature.inputs + sample.signature.outputs
            )
            self.stdout.write(f"{directory / sample.filename}: {sample.size} bytes, {tensors}")
        self.stdout.write(f"{directory / 'samples.json'} and {directory / 'README.md'} list them.")
