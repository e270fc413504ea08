from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('models_registry', '0005_version_example_request'),
    ]

    operations = [
        migrations.AddField(
            model_name='modelversion',
            name='measured_memory_bytes',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='modelversion',
            name='measured_memory_by',
            field=models.CharField(blank=True, max_length=200),
        ),
    ]
