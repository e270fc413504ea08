# Every migration of this app until nothing was released yet, folded into one (issue 22): the empty merge of the two
# 0002s and the status choices frozen in each AlterField are gone; the tables, columns, constraints and defaults are
# what 0001_initial through 0010_canary_guardrail_defaults left, so a database migrated with those (they are listed
# in `replaces`) counts this one as applied and goes on from here. deployments/tests/test_migrations.py checks both.

import infra.names
import deployments.models
import deployments.revision_spec
import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    replaces = [
        ('deployments', '0001_initial'),
        ('deployments', '0002_deployment_reconcile_queued_at'),
        ('deployments', '0002_sandbox'),
        ('deployments', '0003_merge_sandbox_and_reconcile_queue'),
        ('deployments', '0004_deployment_grpc_upstream'),
        ('deployments', '0005_revision_spec_field'),
        ('deployments', '0006_reconciler_ticks'),
        ('deployments', '0007_deployment_status_building'),
        ('deployments', '0008_canary'),
        ('deployments', '0009_pools'),
        ('deployments', '0010_canary_guardrail_defaults'),
    ]

    dependencies = [
        ('accounts', '0005_team_quota'),
        ('models_registry', '0004_teamstoragequota'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='Deployment',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=63, validators=[infra.names.validate_name])),
                ('runtime', models.CharField(choices=[('local', 'Local Triton process'), ('kubernetes', 'Kubernetes cluster')], default='local', max_length=16)),
                ('desired_state', models.CharField(choices=[('running', 'Running'), ('stopped', 'Stopped'), ('deleted', 'Deleted')], default='running', max_length=16)),
                ('status', models.CharField(choices=[('pending', 'Pending'), ('rendering', 'Rendering'), ('building', 'Building'), ('starting', 'Starting'), ('ready', 'Ready'), ('failed', 'Failed'), ('stopping', 'Stopping'), ('stopped', 'Stopped')], default='pending', max_length=16)),
                ('status_message', models.TextField(blank=True)),
                ('upstream_url', models.CharField(blank=True, max_length=255)),
                ('grpc_upstream', models.CharField(blank=True, max_length=255)),
                ('serving_launch', models.JSONField(blank=True, null=True)),
                ('launch', models.JSONField(blank=True, null=True)),
                ('launch_deadline', models.DateTimeField(blank=True, null=True)),
                ('drain_until', models.DateTimeField(blank=True, null=True)),
                ('lease_until', models.DateTimeField(blank=True, null=True)),
                ('reconcile_due_at', models.DateTimeField(blank=True, null=True)),
                ('allow_egress', models.BooleanField(default=False, help_text="Let this deployment's models open outgoing connections (to the ports in SANDBOX_EGRESS_PORTS). Takes effect by restarting its Triton.")),
                ('canary_percent', models.PositiveSmallIntegerField(default=0)),
                ('canary_upstream_url', models.CharField(blank=True, max_length=255)),
                ('canary_grpc_upstream', models.CharField(blank=True, max_length=255)),
                ('canary_launch', models.JSONField(blank=True, null=True)),
                ('canary_deadline', models.DateTimeField(blank=True, null=True)),
                ('canary_serving_since', models.DateTimeField(blank=True, null=True)),
                ('canary_max_error_rate', models.FloatField(default=0.05)),
                ('canary_max_p99_ratio', models.FloatField(default=2.0)),
                ('canary_window_seconds', models.PositiveIntegerField(default=120)),
                ('canary_min_requests', models.PositiveIntegerField(default=100)),
                ('canary_auto_promote', models.BooleanField(default=False)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('updated_at', models.DateTimeField(auto_now=True)),
                ('status_changed_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('created_by', models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('team', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='deployments', to='accounts.team')),
            ],
            options={
                'ordering': ['name'],
            },
        ),
        migrations.CreateModel(
            name='Event',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('time', models.DateTimeField(db_index=True, default=django.utils.timezone.now)),
                ('kind', models.CharField(choices=[('info', 'Info'), ('warning', 'Warning'), ('error', 'Error')], default='info', max_length=16)),
                ('message', models.TextField()),
                ('deployment', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='events', to='deployments.deployment')),
            ],
            options={
                'ordering': ['-time', '-id'],
            },
        ),
        migrations.CreateModel(
            name='Pool',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=63, unique=True, validators=[infra.names.validate_name])),
                ('runtime', models.CharField(choices=[('local', 'Local Triton process'), ('kubernetes', 'Kubernetes cluster')], default='local', max_length=16)),
                ('memory_budget_bytes', models.BigIntegerField(help_text='What the models loaded in it may take together, as measured when each loads.')),
                ('idle_unload_seconds', models.PositiveIntegerField(default=600, help_text='A model unused this long is unloaded (its next request loads it again); 0: never unload.')),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('team', models.ForeignKey(blank=True, help_text="Empty: open to every team (ONNX only). A team: that team's own pool, where python models, TorchScript and SavedModels may go too.", null=True, on_delete=django.db.models.deletion.CASCADE, related_name='pools', to='accounts.team')),
            ],
            options={
                'ordering': ['name'],
            },
        ),
        migrations.CreateModel(
            name='PoolServer',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('pid', models.IntegerField()),
                ('http_port', models.IntegerField()),
                ('grpc_port', models.IntegerField()),
                ('metrics_port', models.IntegerField()),
                ('log_path', models.CharField(max_length=500)),
                ('admin_key', models.CharField(max_length=64)),
                ('state', models.CharField(choices=[('running', 'Running'), ('stopped', 'Stopped')], default='running', max_length=16)),
                ('sandboxed', models.BooleanField(default=False)),
                ('sandbox_id', models.CharField(blank=True, max_length=64)),
                ('cgroups', models.JSONField(blank=True, default=list)),
                ('started_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('stopped_at', models.DateTimeField(blank=True, null=True)),
                ('pool', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='servers', to='deployments.pool')),
            ],
            options={
                'ordering': ['-started_at'],
            },
        ),
        migrations.CreateModel(
            name='Revision',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('number', models.PositiveIntegerField()),
                ('spec', deployments.models.RevisionSpecField(encoder=deployments.revision_spec.SpecEncoder)),
                ('repository', models.CharField(blank=True, max_length=500)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('created_by', models.ForeignKey(null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
                ('deployment', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='revisions', to='deployments.deployment')),
                ('versions', models.ManyToManyField(related_name='revisions', to='models_registry.modelversion')),
            ],
            options={
                'ordering': ['deployment', '-number'],
            },
        ),
        migrations.CreateModel(
            name='PoolLoad',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('state', models.CharField(choices=[('loading', 'Loading'), ('loaded', 'Loaded'), ('unloaded', 'Unloaded'), ('failed', 'Failed')], default='loading', max_length=16)),
                ('message', models.TextField(blank=True)),
                ('idle_unload_seconds', models.PositiveIntegerField(default=0)),
                ('memory_bytes', models.BigIntegerField(default=0)),
                ('loaded_at', models.DateTimeField(blank=True, null=True)),
                ('last_used_at', models.DateTimeField(blank=True, null=True)),
                ('cold_start_seconds', models.FloatField(blank=True, null=True)),
                ('deployment', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='pool_loads', to='deployments.deployment')),
                ('pool', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='loads', to='deployments.pool')),
                ('server', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='loads', to='deployments.poolserver')),
                ('revision', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='pool_loads', to='deployments.revision')),
            ],
        ),
        migrations.AddField(
            model_name='deployment',
            name='canary_revision',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='deployments.revision'),
        ),
        migrations.AddField(
            model_name='deployment',
            name='revision',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='deployments.revision'),
        ),
        migrations.AddField(
            model_name='deployment',
            name='serving_revision',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='deployments.revision'),
        ),
        migrations.CreateModel(
            name='TritonServer',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('pid', models.IntegerField()),
                ('http_port', models.IntegerField()),
                ('grpc_port', models.IntegerField()),
                ('metrics_port', models.IntegerField()),
                ('log_path', models.CharField(max_length=500)),
                ('state', models.CharField(choices=[('starting', 'Starting'), ('ready', 'Ready'), ('stopped', 'Stopped')], default='starting', max_length=16)),
                ('started_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('stopped_at', models.DateTimeField(blank=True, null=True)),
                ('sandboxed', models.BooleanField(default=False)),
                ('sandbox_note', models.TextField(blank=True)),
                ('sandbox_id', models.CharField(blank=True, max_length=64)),
                ('cgroups', models.JSONField(blank=True, default=list)),
                ('allow_egress', models.BooleanField(default=False)),
                ('admin_key', models.CharField(blank=True, max_length=64)),
                ('deployment', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='servers', to='deployments.deployment')),
                ('revision', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='servers', to='deployments.revision')),
            ],
            options={
                'ordering': ['-started_at'],
            },
        ),
        migrations.CreateModel(
            name='ModelMemory',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('fingerprint', models.CharField(max_length=64)),
                ('memory_bytes', models.BigIntegerField()),
                ('measured_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('version', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='memory', to='models_registry.modelversion')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('version', 'fingerprint'), name='model_memory_unique')],
            },
        ),
        migrations.AddConstraint(
            model_name='revision',
            constraint=models.UniqueConstraint(fields=('deployment', 'number'), name='revision_number_unique'),
        ),
        migrations.AddConstraint(
            model_name='poolload',
            constraint=models.UniqueConstraint(fields=('pool', 'revision'), name='pool_load_unique_per_revision'),
        ),
        migrations.AddConstraint(
            model_name='deployment',
            constraint=models.UniqueConstraint(fields=('team', 'name'), name='deployment_name_unique_per_team'),
        ),
    ]
