"""The exceptions the layers share: raised by the core's readers and by the apps' checks alike, caught by the upload
request (a 400) and the inspection task (an invalid version)."""

from __future__ import annotations


class ArtifactRejected(ValueError):
    """The artifact cannot become a model version; the message tells the user what to fix."""
