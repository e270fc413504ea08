"""What serves one revision, as the reconciler records it on the deployment's row between ticks (its three launch
columns, deployments.models.LaunchField). Plain: the runtimes make these and the models store them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Launch:
    """What serves one revision: a server (or a set of pods)."""

    revision_id: int
    url: str  # what the gateway proxies to
    description: str  # for events: "pid 123, port 8000" or "Deployment acme/digits, 2 replicas"
    ref: int | str  # runtime-specific handle (a TritonServer id, a Kubernetes object name)
    grpc_target: str = ""  # host:port of the same server's gRPC endpoint, for the gRPC gateway

    def to_json(self) -> dict[str, Any]:
        return {"revision_id": self.revision_id, "url": self.url, "grpc_target": self.grpc_target,
                "description": self.description, "ref": self.ref}

    @classmethod
    def from_json(cls, data: Any) -> Launch | None:
        """None for anything but a stored Launch (a row written before launches were recorded). Read only by
        deployments.models.LaunchField: the rows' three launch columns are Launch values everywhere else."""
        if isinstance(data, Launch):
            return data
        if not isinstance(data, dict):
            return None
        try:
            return cls(revision_id=int(data["revision_id"]), url=str(data["url"]),
                       grpc_target=str(data.get("grpc_target", "")),
                       description=str(data.get("description", "")), ref=data["ref"])
        except (KeyError, TypeError, ValueError):
            return None


class LaunchEncoder(json.JSONEncoder):
    """Writes a Launch as its JSON (the launch columns, the admin's read-only view of them)."""

    def default(self, o: Any) -> Any:
        if isinstance(o, Launch):
            return o.to_json()
        return super().default(o)
