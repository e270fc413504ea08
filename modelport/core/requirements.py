"""Requirement lines of an uploaded requirements.txt (python models): parsed and bounded here, the one front door
for them, before inspection stores them or the local runtime builds an environment from them (deployments.pyenvs).

requirements.txt is uploaded, hence hostile. Each line must be a plain PEP 508 requirement (a name, extras, version
specifiers, a marker): no options (-r, -e, --index-url, --hash, ...), no URLs, no paths, so the uploader can choose
neither the index nor a local file.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

MAX_REQUIREMENTS = 100
MAX_LINE_LENGTH = 500

# A name first: every option starts with "-", every path with "." or "/", a URL with its scheme (caught below).
_STARTS_LIKE_A_NAME = re.compile(r"^[A-Za-z0-9]")
# What pip reads as a local archive (pip's ARCHIVE_EXTENSIONS).
_ARCHIVE_ENDINGS = (".whl", ".zip", ".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".tlz",
                    ".tar.lz", ".tar.lzma")


# The tools that make and fill the environment, not dependencies of a model: pip installs it (the runtime env's
# pip, run with --python), setuptools and wheel come from the runtime env behind it (its .pth), distribute is
# setuptools' old fork. A model's own copy would be a second installer in its environment, or a setuptools whose
# distutils-precedence.pth runs at every interpreter start of its Triton stub; and a version other than the runtime
# env's ("setuptools>=99") only fails the build later, as a conflict with the runtime env's constraints, in the
# build lane. Other build tools (build, virtualenv, hatchling, flit-core, setuptools-scm) are ordinary packages
# here: pip installs wheels only and never builds, and they change nothing of the environment unless a model runs
# them.
PACKAGING_TOOLS = frozenset({"pip", "setuptools", "wheel", "distribute"})


class RequirementError(ValueError):
    """A requirements.txt line that is not a plain requirement; the message names the line and what to fix."""


def parse_line(line: str) -> Requirement:
    """One requirements.txt line (comments already removed) as a PEP 508 requirement, or RequirementError."""
    text = line.strip()
    if len(text) > MAX_LINE_LENGTH:
        raise RequirementError(f"longer than {MAX_LINE_LENGTH} characters")
    if not _STARTS_LIKE_A_NAME.match(text) or "\\" in text:
        raise RequirementError("not a package requirement: options (-r, -e, --index-url, --hash, ...), paths and "
                               "URLs are not accepted; list packages such as 'numpy>=1.26'")
    if "://" in text or "@" in text.split(";", 1)[0]:
        raise RequirementError("URLs ('name @ https://...', 'git+...') are not accepted: the operator chooses the "
                               "package index; list packages such as 'numpy>=1.26'")
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        raise RequirementError(f"not a valid requirement ({exc}); list packages such as 'numpy>=1.26'") from None
    if requirement.url:
        raise RequirementError("URLs are not accepted: the operator chooses the package index")
    if canonicalize_name(requirement.name) in PACKAGING_TOOLS:
        raise RequirementError(f"{requirement.name!r} is a packaging tool, not a dependency of the model: pip, "
                               "setuptools and wheel are the runtime environment's own, already there for the "
                               "model, and its environment is built with them; remove the line")
    # pip takes an argument that ends like an archive ("evil.tar.gz", "x===evil.tar.gz", "x==1+evil.tgz": a valid
    # name, an arbitrary-equality version, a local version label) for a file in its working directory, and builds
    # an sdist even with --only-binary=:all:. No package is named so, and '===' matches no real version of one.
    parts = [requirement.name, *(s.version for s in requirement.specifier)]
    if any(part.lower().endswith(_ARCHIVE_ENDINGS) for part in parts) or any(
            s.operator == "===" for s in requirement.specifier):
        raise RequirementError("a name or version that ends like a file ('.whl', '.tar.gz', '.zip', ...) or an "
                               "'===' version is not accepted: pip would read it as a local file; list packages "
                               "such as 'numpy>=1.26'")
    return requirement


def parse_requirements(lines: Sequence[str]) -> list[Requirement]:
    """Lines as stored at inspection (no blanks, no comments). RequirementError names the first bad one."""
    if len(lines) > MAX_REQUIREMENTS:
        raise RequirementError(f"{len(lines)} requirements: at most {MAX_REQUIREMENTS} are accepted")
    parsed = []
    for number, line in enumerate(lines, start=1):
        try:
            parsed.append(parse_line(line))
        except RequirementError as exc:
            raise RequirementError(f"requirement {number} ({line[:80]!r}) is refused: {exc}") from None
    return parsed


def parse_requirements_txt(text: str) -> list[str]:
    """An uploaded requirements.txt: its requirement lines (comments and blanks dropped), each checked by
    parse_line. RequirementError says which line of the file is refused and why."""
    kept = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(" #", 1)[0].split("\t#", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        try:
            parse_line(line)
        except RequirementError as exc:
            raise RequirementError(f"requirements.txt line {number} ({line[:80]!r}) is refused: {exc}") from None
        kept.append(line)
    if len(kept) > MAX_REQUIREMENTS:
        raise RequirementError(f"requirements.txt lists {len(kept)} requirements: at most {MAX_REQUIREMENTS}")
    return kept


def normalized(requirements: Sequence[Requirement]) -> tuple[str, ...]:
    """The requirement set, one canonical line per requirement, sorted and without duplicates: the same set
    written differently ("Six>=1" and "six >= 1") gives the same environment."""
    lines = set()
    for r in requirements:
        extras = f"[{','.join(sorted(canonicalize_name(e) for e in r.extras))}]" if r.extras else ""
        specifier = ",".join(sorted(str(s) for s in r.specifier))
        marker = f"; {r.marker}" if r.marker else ""
        lines.add(f"{canonicalize_name(r.name)}{extras}{specifier}{marker}")
    return tuple(sorted(lines))
