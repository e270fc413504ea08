from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('models_registry', '0007_version_decoupled'),
    ]

    operations = [
        migrations.AddField(
            model_name='modelversion',
            name='chat_template',
            field=models.TextField(blank=True, default=''),
        ),
    ]
