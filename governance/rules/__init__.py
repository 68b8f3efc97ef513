"""The rules of docs/rules.md as pure modules, one per part of the spec.

Nothing here imports Django, Celery, the network or the clock: time is a
parameter (tests/test_layers.py checks this folder). The runtime calls these
functions; a rule decided again in a task, a view or a service is a bug.
"""
