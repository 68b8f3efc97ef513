"""Issue 12: indexes for the dashboard pages at production size (placeholder: the
operations are added by the page work; the delivery report's migration 0015
follows this one)."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("governance", "0013_refusal_schedules")]

    operations = []
