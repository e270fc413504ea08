from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.decorators import api_view, permission_classes
from rest_framework.request import Request
from rest_framework.response import Response

from accounts.context import current_team
from accounts.permissions import IsTeamAdmin
from audit.models import AuditEntry
from infra.api_schema import error


class AuditEntrySerializer(serializers.ModelSerializer[AuditEntry]):
    class Meta:
        model = AuditEntry
        fields = ["time", "username", "action", "target", "detail"]
        read_only_fields = fields


@extend_schema(summary="Your team's audit log, newest first (the last 500)", parameters=[
    OpenApiParameter("action", str, description="Only entries of this action, e.g. 'deployment.stop'."),
], responses={200: AuditEntrySerializer(many=True),
              403: error("Only team admins read the audit log (and: no team).")})
@api_view(["GET"])
@permission_classes([IsTeamAdmin])
def audit_log(request: Request) -> Response:
    """The team's audit log, newest first (team admins only). ?action=deployment.stop filters by action."""
    entries = AuditEntry.objects.filter(team=current_team(request))
    if action := request.query_params.get("action"):
        entries = entries.filter(action=action)
    return Response(AuditEntrySerializer(entries[:500], many=True).data)
