"""The folded migrations (issue 22): a fresh database and one migrated with the old graph end identical.

What this file checks on every run: the migrations say what the models say (`makemigrations --check`); a database
that recorded the eleven old migrations (an upgraded one) counts the fold as applied and has nothing of it left to
run; and the tables the fold creates hold every column of the models. When the fold was made, a database migrated
with the old files and one migrated fresh were also compared column by column and constraint by constraint through
Django's introspection (identical, 24 tables), which needs the old files and so is not repeated here."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.apps import apps
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.recorder import MigrationRecorder

FOLD = ("deployments", "0001_squashed_0010_canary_guardrail_defaults")


@pytest.mark.django_db  # makemigrations checks the recorded history against the graph
def test_the_migrations_say_what_the_models_say() -> None:
    out = StringIO()
    call_command("makemigrations", "--check", "--dry-run", stdout=out)  # SystemExit(1) when a change is missing
    assert "No changes detected" in out.getvalue()


@pytest.mark.django_db
def test_a_database_migrated_with_the_old_graph_counts_the_fold_as_applied() -> None:
    recorder = MigrationRecorder(connection)
    executor = MigrationExecutor(connection)
    replaced = executor.loader.disk_migrations[FOLD].replaces
    assert len(replaced) == 11 and ("deployments", "0003_merge_sandbox_and_reconcile_queue") in replaced
    # As an upgraded database has it: the old names recorded, the fold's own not.
    recorder.migration_qs.filter(app="deployments", name=FOLD[1]).delete()
    for app, name in replaced:
        recorder.record_applied(app, name)
    executor = MigrationExecutor(connection)
    assert FOLD in executor.loader.applied_migrations
    assert executor.migration_plan(executor.loader.graph.leaf_nodes()) == []


@pytest.mark.django_db
def test_a_fresh_database_has_every_column_of_the_models() -> None:
    missing: list[str] = []
    with connection.cursor() as cursor:
        for model in apps.get_app_config("deployments").get_models():
            columns: dict[str, Any] = {c.name: c for c in
                                       connection.introspection.get_table_description(cursor, model._meta.db_table)}
            for field in model._meta.local_concrete_fields:
                column = columns.get(field.column)
                if column is None or bool(column.null_ok) != field.null:
                    missing.append(f"{model._meta.db_table}.{field.column}")
    assert missing == []
