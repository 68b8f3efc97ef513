"""dashboard.site.loop_db: database work from the event loop hands its connection back."""

from __future__ import annotations

import asyncio

import pytest
from django.db import connection

from dashboard.site.loop_db import off_loop
from governance.models import Run

pytestmark = pytest.mark.django_db(transaction=True)


def test_each_call_gives_its_connection_back_to_the_pool():
    pool = connection.pool  # the web's psycopg pool (DATABASES OPTIONS "pool")
    connection.close()  # this thread's own is back too

    def kept_out() -> int:  # connections taken from the pool and not given back
        stats = pool.get_stats()
        return stats["pool_size"] - stats["pool_available"]

    before = kept_out()  # (threads of earlier tests may keep some)

    async def many_reads() -> list[int]:
        # More calls than the pool holds, from as many threads as the loop's pool has.
        return await asyncio.gather(
            *(off_loop(Run.objects.count)() for _ in range(3 * pool.max_size))
        )

    for _loop in range(3):  # each asyncio.run: a new loop with new threads
        assert asyncio.run(many_reads()) == [0] * (3 * pool.max_size)
    assert kept_out() <= before, pool.get_stats()  # none kept by a pool thread
