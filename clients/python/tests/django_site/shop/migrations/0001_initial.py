# The README's migration: idempotency by either edition (CREATE EXTENSION, or
# the portable edition's script of the setting IDEMPOTENCY_PORTABLE_SCRIPT),
# then the app's own tables.
from django.db import migrations, models

from pg_idempotency.django import InstallIdempotency


class Migration(migrations.Migration):
    initial = True
    dependencies = []
    operations = [
        InstallIdempotency(),
        migrations.CreateModel(
            name="Order",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False,
                                           verbose_name="ID")),
                ("idem_key", models.TextField()),
                ("amount", models.DecimalField(decimal_places=2, max_digits=12)),
                ("created_at", models.DateTimeField(auto_now_add=True)),
            ],
        ),
    ]
