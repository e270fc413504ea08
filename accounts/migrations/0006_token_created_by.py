"""Which token created which (ApiToken.created_by), so that revoking a token revokes what it created.

Tokens created before this field are linked from the audit log, whose "token.create" rows say "via token <prefix>"
for a token created with a token: a link is made only when the creator is unambiguous (one token of that prefix,
user and team, created before). Then what earlier versions left working is revoked now: every token below one that
is revoked, each with an audit row ("via": "migration", "revoked_with": the revoked ancestor's prefix)."""

import django.db.models.deletion
from django.db import migrations, models

VIA_TOKEN = "token "


def link_and_revoke(apps, schema_editor):
    ApiToken = apps.get_model("accounts", "ApiToken")
    AuditEntry = apps.get_model("audit", "AuditEntry")
    for entry in AuditEntry.objects.filter(action="token.create").order_by("pk").iterator():
        via = (entry.detail or {}).get("via", "") if isinstance(entry.detail, dict) else ""
        if not isinstance(via, str) or not via.startswith(VIA_TOKEN):
            continue
        children = list(ApiToken.objects.filter(prefix=entry.target, team_id=entry.team_id, user_id=entry.user_id,
                                                created_by__isnull=True)[:2])
        if len(children) != 1:
            continue
        child = children[0]
        parents = list(ApiToken.objects.filter(prefix=via[len(VIA_TOKEN):], team_id=child.team_id,
                                               user_id=child.user_id, created_at__lte=child.created_at)
                       .exclude(pk=child.pk)[:2])
        if len(parents) == 1:
            ApiToken.objects.filter(pk=child.pk).update(created_by=parents[0])

    from django.utils import timezone

    now = timezone.now()
    for root in ApiToken.objects.filter(revoked_at__isnull=False, created_tokens__isnull=False).distinct():
        seen, generation = {root.pk}, [root.pk]
        while generation:
            children = list(ApiToken.objects.filter(created_by_id__in=generation).exclude(pk__in=seen))
            for child in children:
                if child.revoked_at is None:
                    ApiToken.objects.filter(pk=child.pk).update(revoked_at=now)
                    AuditEntry.objects.create(team_id=child.team_id, user=None, username="", action="token.revoke",
                                              target=child.prefix, detail={"name": child.name, "via": "migration",
                                                                           "revoked_with": root.prefix})
            seen.update(child.pk for child in children)
            generation = [child.pk for child in children]


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0005_team_quota"),
        ("audit", "0002_audit_entries_plural"),
    ]

    operations = [
        migrations.AddField(
            model_name="apitoken",
            name="created_by",
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE,
                                    related_name="created_tokens", to="accounts.apitoken"),
        ),
        migrations.RunPython(link_and_revoke, migrations.RunPython.noop),
    ]
