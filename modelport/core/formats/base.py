"""The interface every model format implements, and the registry the format modules fill.

A `Format` says, for one format: its names (the stored value, the labels people read), how to recognise it from
its bytes (`detect_file` for a single file, `detect_archive` for a listed archive), how to read what inspection
needs from it (`inspect`), and how it is served on each target: natively by the official Triton image on
Kubernetes (`native`), and on the local tritonserver, which has only the python backend, either through a generated
python-backend wrapper (`local.wrapper`), natively (python models) or not at all (`local.refused`). `write_artifact`
lays the artifact out in a Triton version directory; the same layout serves both targets.

Plain Python, no Django at import: the format modules import their heavier dependencies (onnx, the trial run)
inside the functions that need them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from modelport.core import archives
from modelport.core.definitions import Definition, ReadDefinition
from modelport.core.signature import Signature

# The generated python-backend models and the helpers they import, copied into the local repository.
BACKENDS_DIR = Path(__file__).resolve().parents[1] / "backends"
BATCHING_MODULE = BACKENDS_DIR / "triton_batching.py"


# A dynamic batch dimension has no upper bound in the model itself: the Triton limit offered when the artifact
# states none (inspection stores it; the deploy form starts from it).
DEFAULT_MAX_BATCH_SIZE = 64


class InspectionError(ValueError):
    """An artifact that is not what it claims to be; the message is shown to the uploader."""


class LayoutError(ValueError):
    """An artifact whose content cannot be laid out for Triton; the message says what the archive must hold."""


@dataclass(frozen=True)
class ArchiveListing:
    """An archive being recognised: its kind ("zip", "tar"...), and its entry names without Finder's clutter."""

    path: Path
    kind: str
    files: list[str]  # file entries
    entries: list[str]  # files and directories


@dataclass(frozen=True)
class Inspected:
    """What inspection read from an artifact (or took from the declaration, for formats that carry none)."""

    signature: Signature
    batchable: bool
    max_batch_size_hint: int = 0  # a limit the artifact states; 0: none
    # Stored as the version's `definition` (python requirements, the SavedModel's signature_def, a trial run note).
    definition: Definition | None = None
    # The artifact must be run once before it is accepted (TorchScript's trial run, a python model's trial call):
    # the inspection task does it, with the operator's runtime env, sandbox and limits, since the core reads no
    # settings.
    needs_trial_run: bool = False


@dataclass(frozen=True)
class NativeBackend:
    """How the official Triton image serves the format: config.pbtxt's `platform` and/or `backend`."""

    platform: str = ""
    backend: str = ""
    # A custom backend built into an operator's image, named by configuration (KUBERNETES_TNN_BACKEND_NAME).
    custom: bool = False


@dataclass(frozen=True)
class LocalServing:
    """How the local tritonserver (python backend only) serves the format."""

    # A generated python-backend model copied as model.py beside the artifact, and the modules it imports.
    wrapper: Path | None = None
    modules: tuple[Path, ...] = ()
    # Why the local runtime cannot serve the format at all ("": it can).
    refused: str = ""
    # The format's models in a sentence about local serving ("TorchScript models cannot be served locally: ...").
    noun: str = ""
    # A signature the wrapper cannot serve, as a message for the "signature" field; None when it can.
    signature_problem: Callable[[Signature], str | None] | None = None


@dataclass(frozen=True)
class Format:
    name: str  # the value stored in ModelVersion.format
    label: str  # the choice label (forms, admin)
    short_label: str  # in a summary of settings ("TorchScript", "pipeline")
    plural: str  # in a sentence about what a runtime serves ("TensorFlow SavedModels")
    description: str  # finishes "the file looks like ..."
    # What to upload, in a refusal's advice ("an ONNX model (the .onnx file)"): the files and their names, never the
    # stored name; "" for a format that is not uploaded.
    upload_as: str
    # The artifact carries no signature the portal can read: the uploader declares it.
    needs_signature: bool
    native: NativeBackend
    local: LocalServing = field(default_factory=LocalServing)
    # File name extensions the upload page takes as a hint (to ask for a signature early); never proof of anything.
    extensions: tuple[str, ...] = ()
    # Recognition from content; lower `detect_order` runs first (the more specific test before the looser one).
    detect_order: int = 100
    detect_file: Callable[[Path], bool] | None = None
    detect_archive: Callable[[ArchiveListing], bool] | None = None
    # (path, declared signature or None, archive limits) -> Inspected; raises InspectionError or ArtifactRejected.
    inspect: Callable[[Path, Signature | None, archives.ArchiveLimits], Inspected] | None = None
    # (artifact, version directory, scratch directory, archive limits); raises LayoutError. None: nothing to write.
    write_artifact: Callable[[Path, Path, Path, archives.ArchiveLimits], None] | None = None
    # Reads a version's stored definition into the format's typed one (modelport/core/definitions.py); None: the
    # format has none.
    read_definition: ReadDefinition | None = None

    @property
    def uploadable(self) -> bool:
        """Whether a file of this format can be uploaded (a pipeline is defined by its steps instead)."""
        return self.detect_file is not None or self.detect_archive is not None


# Filled by the format modules as they are imported; modelport.core.formats.REGISTRY lists them in order.
REGISTERED: dict[str, Format] = {}


def register(fmt: Format) -> Format:
    """Add a format to the registry; each format module registers its one format at import."""
    if fmt.name in REGISTERED:
        raise ValueError(f"format {fmt.name!r} is registered twice")
    REGISTERED[fmt.name] = fmt
    return fmt


def extract(archive: Path, dest: Path, limits: archives.ArchiveLimits) -> None:
    """Extract an uploaded archive for rendering, through the one module that opens them (links, traversal and
    bombs are refused there)."""
    try:
        archives.safe_extract(archive, dest, limits)
    except ValueError as exc:
        raise LayoutError(f"the archive cannot be extracted: {exc}") from None


def read_archive_entry(path: Path, name: str, limit: int) -> bytes:
    """An archive entry's bytes, refusing (not truncating) one bigger than `limit`."""
    try:
        return archives.read_small_entry(path, name, limit)
    except archives.ArchiveError as exc:
        raise InspectionError(str(exc)) from None


def archive_names(path: Path, limits: archives.ArchiveLimits | None) -> list[str]:
    """The file entries of an archive being inspected, without Finder's clutter; InspectionError if refused."""
    try:
        names = archives.list_names(path, limits or archives.LISTING_LIMITS)
    except archives.ArchiveError as exc:
        raise InspectionError(str(exc)) from None
    return archives.model_names(names)
