# The three launch columns read and write deployments.launch.Launch values (deployments.models.LaunchField): the
# same JSON in the database, so nothing is rewritten.

import deployments.launch
import deployments.models
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('deployments', '0001_squashed_0010_canary_guardrail_defaults'),
    ]

    operations = [
        migrations.AlterField(model_name='deployment', name=name, field=deployments.models.LaunchField(
            blank=True, encoder=deployments.launch.LaunchEncoder, null=True))
        for name in ('serving_launch', 'launch', 'canary_launch')
    ]
