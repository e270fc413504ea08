from django.db import migrations, models


class Migration(migrations.Migration):
    """The reconciler records between its ticks what it used to hold in a waiting worker (deployments/reconcile.py);
    a queued tick's mark is when it is due, since follow-up ticks are queued with a countdown."""

    dependencies = [
        ("deployments", "0005_revision_spec_field"),
    ]

    operations = [
        migrations.RenameField(model_name="deployment", old_name="reconcile_queued_at", new_name="reconcile_due_at"),
        migrations.AddField(model_name="deployment", name="serving_launch",
                            field=models.JSONField(blank=True, null=True)),
        migrations.AddField(model_name="deployment", name="launch", field=models.JSONField(blank=True, null=True)),
        migrations.AddField(model_name="deployment", name="launch_deadline",
                            field=models.DateTimeField(blank=True, null=True)),
        migrations.AddField(model_name="deployment", name="drain_until",
                            field=models.DateTimeField(blank=True, null=True)),
    ]
