# The admin read "Api tokens" (Django's name from the class name).

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('accounts', '0006_token_created_by'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='apitoken',
            options={'ordering': ['-created_at'], 'verbose_name': 'API token'},
        ),
    ]
