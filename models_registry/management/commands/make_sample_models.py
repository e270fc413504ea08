from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser


class Command(BaseCommand):
    help = ("Write the sample models (digits.onnx, resnet.onnx, preprocess.zip, postprocess.zip, the streaming text "
            "generator textgen.zip) and the pipeline "
            "digits-pipeline.json, with samples.json and README.md, into DIR; and the CNN as resnet.pt and "
            "resnet.savedmodel.zip when the runtime env has PyTorch / TensorFlow.")

    # It writes files only: no database and no secret key, so a fresh checkout can run it before `make run`
    # (the system checks refused it there for want of var/secret_key).
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("directory", metavar="DIR", type=Path)

    def handle(self, *args: Any, **options: Any) -> None:
        # Imported here: scikit-learn takes a second to import, and other commands should not pay for it.
        from django.conf import settings

        from modelport.core import frameworks
        from modelport.core.runtime_env import RuntimeEnv, RuntimeEnvError, find_runtime_env
        from models_registry.samples import ExportFailed, write_samples

        directory: Path = options["directory"]
        if directory.exists() and not directory.is_dir():
            raise CommandError(f"{directory} exists and is not a directory")
        # The TorchScript and SavedModel copies of the CNN are written by the runtime env's frameworks.
        try:
            env: RuntimeEnv | None = find_runtime_env(settings.MODELPORT_RUNTIME_ENV)
        except RuntimeEnvError:
            env = None
        found = frameworks.detect(env.site_packages) if env is not None else {}
        try:
            samples = write_samples(directory, runtime_python=env.bin_dir / "python" if env else None, frameworks=found)
        except ExportFailed as exc:
            raise CommandError(str(exc)) from None
        for framework in frameworks.FRAMEWORKS:
            if framework.name not in found:
                self.stdout.write(f"Skipped the CNN for {framework.label}: the runtime env has none "
                                  f"(`{framework.install_command}`).")
        for sample in samples:
            tensors = ", ".join(
                f"{t.name} {t.datatype}{list(t.dims)}" for t in sample.signature.inputs + sample.signature.outputs
            )
            self.stdout.write(f"{directory / sample.filename}: {sample.size} bytes, {tensors}")
        self.stdout.write(f"{directory / 'samples.json'} and {directory / 'README.md'} list them.")
