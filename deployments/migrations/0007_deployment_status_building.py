from django.db import migrations, models


class Migration(migrations.Migration):
    """A deployment is "building" while a python model's requirements are installed (deployments/pyenvs.py)."""

    dependencies = [
        ("deployments", "0006_reconciler_ticks"),
    ]

    operations = [
        migrations.AlterField(
            model_name="deployment",
            name="status",
            field=models.CharField(choices=[("pending", "Pending"), ("rendering", "Rendering"),
                                            ("building", "Building"), ("starting", "Starting"), ("ready", "Ready"),
                                            ("failed", "Failed"), ("stopping", "Stopping"), ("stopped", "Stopped")],
                                   default="pending", max_length=16),
        ),
    ]
