"""Remove raw API tokens that earlier versions kept: in the idempotency records of token creations (the whole
201 body, token included) and in browser sessions (the token shown once after its creation, kept until shown).
The tokens themselves stay valid; a retried creation now gets a 409 naming the token instead of its value."""

from django.conf import settings
from django.db import migrations

OLD_SESSION_KEY = "web_new_token"


def forget_raw_tokens(apps, schema_editor):
    IdempotencyRecord = apps.get_model("accounts", "IdempotencyRecord")
    # Only token creations answered with a "token" field; the records expire within 24 hours anyway.
    for record in IdempotencyRecord.objects.filter(response_body__has_key="token").iterator():
        record.delete()

    if settings.SESSION_ENGINE != "django.contrib.sessions.backends.db":
        return  # other engines keep sessions outside this database (cache, signed cookies): nothing to rewrite here
    from django.contrib.sessions.backends.db import SessionStore

    Session = apps.get_model("sessions", "Session")
    store = SessionStore()
    for session in Session.objects.iterator():
        data = store.decode(session.session_data)
        if isinstance(data.get(OLD_SESSION_KEY), dict) and "raw" in data[OLD_SESSION_KEY]:
            del data[OLD_SESSION_KEY]
            session.session_data = store.encode(data)
            session.save(update_fields=["session_data"])


class Migration(migrations.Migration):

    dependencies = [
        ("accounts", "0003_token_scopes"),
        ("sessions", "0001_initial"),
    ]

    operations = [migrations.RunPython(forget_raw_tokens, migrations.RunPython.noop)]
