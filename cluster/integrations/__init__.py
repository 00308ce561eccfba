"""Integrations with the Python ecosystem: a kombu transport (hence Celery)."""
