import django.db.models.deletion
from django.db import migrations, models
from django.db.models import OuterRef, Subquery


def keep_folder_names(apps, schema_editor):
    Revision = apps.get_model("serving", "Revision")
    ModelFolder = apps.get_model("serving", "ModelFolder")
    name = ModelFolder.objects.filter(pk=OuterRef("model_folder_id")).values("name")[:1]
    Revision.objects.update(model_folder_name=Subquery(name))


class Migration(migrations.Migration):
    dependencies = [
        ("serving", "0003_runtime_parameters_clusters_and_folder_sync"),
    ]

    operations = [
        migrations.AddField(
            model_name="revision",
            name="model_folder_name",
            field=models.CharField(default="", max_length=100),
            preserve_default=False,
        ),
        migrations.RunPython(keep_folder_names, migrations.RunPython.noop),
        migrations.AddField(
            model_name="revision",
            name="command_settings",
            field=models.JSONField(
                blank=True,
                default=dict,
                help_text="A pasted command's port, health_path, initial_delay and max_retries, "
                "where given instead of derived from it.",
            ),
        ),
        migrations.AddField(
            model_name="revision",
            name="image",
            field=models.CharField(blank=True, max_length=300),
        ),
        migrations.AlterField(
            model_name="revision",
            name="model_folder",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to="serving.modelfolder",
            ),
        ),
    ]
