"""Routes as a fact (configuration the API, the command and the door read, not
a rule of docs/rules.md): the service owns every write, audits it, refuses bad
input naming the field (writing nothing), and keeps route names and provider
ids one namespace, both ways."""

from __future__ import annotations

from datetime import timedelta

import pytest

from governance import services, time_source
from governance.models import AuditEntry, Provider, Route, Thread
from governance.services import providers as provider_services
from governance.services import routes as route_services
from governance.services.errors import ServiceError

pytestmark = pytest.mark.django_db


@pytest.fixture
def providers():
    for provider_id in ("alpha", "beta"):
        Provider.objects.create(provider_id=provider_id, kind="scripted", model="m", script={})


def add(name="fast", chain=("alpha", "beta"), **extra):
    return route_services.create_route(
        name=name, provider_chain=list(chain), by="tester", now=time_source.now(), **extra
    )


def test_a_route_is_created_with_the_time_sources_clock_and_audited(providers):
    now = time_source.now()
    route = route_services.create_route(
        name="fast", provider_chain=["beta", "alpha"], description="low latency",
        by="tester", now=now,
    )  # fmt: skip
    stored = Route.objects.get(name="fast")
    assert stored.provider_chain == ["beta", "alpha"] and stored.enabled
    assert stored.created_at == stored.updated_at == now == route.created_at
    entry = AuditEntry.objects.get(action="route.create")
    assert (entry.actor, entry.target_type, entry.target_id) == ("tester", "route", "fast")
    assert entry.detail["provider_chain"] == ["beta", "alpha"]


@pytest.mark.parametrize(
    "name, chain, extra, field",
    [
        ("bad name!", ["alpha"], {}, "name"),
        ("", ["alpha"], {}, "name"),
        ("x" * 65, ["alpha"], {}, "name"),
        ("fast", [], {}, "provider_chain"),
        ("fast", ["alpha", "alpha"], {}, "provider_chain"),
        ("fast", ["alpha", "nobody"], {}, "provider_chain"),
        ("fast", ["alpha"] + [f"p{i}" for i in range(20)], {}, "provider_chain"),
        ("fast", ["alpha"], {"description": "d" * 2001}, "description"),
        ("fast", ["alpha"], {"enabled": "yes"}, "enabled"),
    ],
)
def test_bad_input_names_its_field_and_writes_nothing(providers, name, chain, extra, field):
    with pytest.raises(ServiceError) as refused:
        add(name, chain, **extra)
    assert refused.value.field == field
    assert not Route.objects.exists() and not AuditEntry.objects.exists()


def test_a_route_may_not_take_a_provider_id(providers):
    with pytest.raises(route_services.NameTaken) as refused:
        add("alpha", ["beta"])
    assert refused.value.field == "name" and "provider" in refused.value.message
    assert not Route.objects.exists()


def test_a_provider_may_not_take_a_routes_name(providers):
    add("fast")
    with pytest.raises(route_services.NameTaken) as refused:
        provider_services.create_provider(
            provider_id="fast", kind="scripted", model="m", script={},
            by="tester", now=time_source.now(),
        )  # fmt: skip
    assert refused.value.field == "provider_id" and "route" in refused.value.message
    assert not Provider.objects.filter(provider_id="fast").exists()


def test_a_name_is_taken_once(providers):
    add("fast")
    with pytest.raises(route_services.RouteExists):
        add("fast", ["alpha"])
    assert Route.objects.get().provider_chain == ["alpha", "beta"]
    assert AuditEntry.objects.filter(action="route.create").count() == 1


def test_an_update_changes_what_is_given_audits_it_and_moves_updated_at(providers):
    add("fast")
    later = time_source.now() + timedelta(minutes=5)
    _route, changed = route_services.update_route(
        "fast", by="tester", now=later, reason="beta first", provider_chain=["beta"],
        enabled=False,
    )  # fmt: skip
    assert changed == ["provider_chain", "enabled"]
    stored = Route.objects.get(name="fast")
    assert (stored.provider_chain, stored.enabled, stored.updated_at) == (["beta"], False, later)
    entry = AuditEntry.objects.get(action="route.update")
    assert entry.reason == "beta first"
    assert entry.detail == {
        "before": {"provider_chain": ["alpha", "beta"], "enabled": True},
        "after": {"provider_chain": ["beta"], "enabled": False},
    }
    # The same again changes nothing and writes nothing.
    _route, changed = route_services.update_route("fast", by="tester", now=later, enabled=False)
    assert changed == [] and AuditEntry.objects.filter(action="route.update").count() == 1


def test_a_bad_update_writes_nothing(providers):
    add("fast")
    before = Route.objects.values().get()
    for changes, field in (
        ({"provider_chain": ["nobody"]}, "provider_chain"),
        ({"name": "renamed"}, "name"),
        ({"enabled": None}, "enabled"),
    ):
        with pytest.raises(ServiceError) as refused:
            route_services.update_route("fast", by="t", now=time_source.now(), **changes)
        assert refused.value.field == field
    assert Route.objects.values().get() == before
    assert not AuditEntry.objects.filter(action="route.update").exists()
    with pytest.raises(Route.DoesNotExist):
        route_services.update_route("nobody", by="t", now=time_source.now(), enabled=False)


def test_threads_share_the_chain_check(providers):
    with pytest.raises(ServiceError) as refused:
        services.create_thread(provider_chain=["alpha", "alpha"], now=time_source.now())
    assert refused.value.field == "provider_chain" and "twice" in refused.value.message
    assert not Thread.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_route_and_a_provider_added_at_once_cannot_both_take_a_name():
    """Two tables, no unique index across them: the lock on the name makes the
    second adder wait for the first's commit and then see its row."""
    import threading

    from django.db import connection, connections, transaction

    # The lock is PostgreSQL's (SQLite has one writer at a time); the suite runs there.
    assert connection.vendor == "postgresql", "run the suite with `make test` (PostgreSQL)"
    Provider.objects.create(provider_id="alpha", kind="scripted", model="m", script={})
    route_taken, outcome = threading.Event(), {}

    def add_provider():
        route_taken.wait(10)
        try:
            provider_services.create_provider(
                provider_id="both", kind="scripted", model="m", script={},
                by="tester", now=time_source.now(),
            )  # fmt: skip
            outcome["provider"] = "added"
        except route_services.NameTaken as exc:
            outcome["provider"] = exc.field
        finally:
            connections.close_all()

    other = threading.Thread(target=add_provider)
    other.start()
    with transaction.atomic():
        route_services.require_free_name("both", for_a="route", field="name")
        Route.objects.create(
            name="both", provider_chain=["alpha"], created_at=time_source.now(),
            updated_at=time_source.now(),
        )  # fmt: skip
        route_taken.set()
        other.join(0.5)
        assert other.is_alive()  # waiting on the name, not deciding without the route
    other.join(10)
    assert outcome == {"provider": "provider_id"}
    assert not Provider.objects.filter(provider_id="both").exists()
