# The admin read "Model memorys" and "triton server" (Django's names from the class names).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('deployments', '0006_pool_pod'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='modelmemory',
            options={'verbose_name': 'model memory measurement'},
        ),
        migrations.AlterModelOptions(
            name='tritonserver',
            options={'ordering': ['-started_at'], 'verbose_name': 'Triton server'},
        ),
    ]
