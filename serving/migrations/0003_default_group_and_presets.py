from django.db import migrations

# Present on every installation, so a first service needs no setup: "default" spans every
# trusted node; the presets are the sizes most replicas want.
PRESETS = [
    ("cpu-small", 1.0, 1 << 30, 0.0),
    ("cpu-medium", 2.0, 4 << 30, 0.0),
    ("cpu-large", 4.0, 8 << 30, 0.0),
    ("gpu-1", 4.0, 16 << 30, 1.0),
]


def create(apps, schema_editor):
    ResourceGroup = apps.get_model("serving", "ResourceGroup")
    ResourcePreset = apps.get_model("serving", "ResourcePreset")
    ResourceGroup.objects.get_or_create(
        name="default", defaults={"all_nodes": True, "description": "Every trusted node."}
    )
    for name, cpu, memory, shares in PRESETS:
        ResourcePreset.objects.get_or_create(
            name=name, defaults={"cpu": cpu, "memory_bytes": memory, "cuda_shares": shares}
        )


class Migration(migrations.Migration):
    dependencies = [("serving", "0002_services_and_health")]

    operations = [migrations.RunPython(create, migrations.RunPython.noop)]
