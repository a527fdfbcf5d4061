"""A lease's heartbeat: renewed while its holder works, and given up when renewals fail."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest

from metering.leases import Heartbeat

LEASE = timedelta(seconds=0.9)  # renewed every 0.3 s: slack for a loaded machine


class Lease:
    """What a table's ``claimed_until`` would hold, written by ``renew``."""

    def __init__(self, failing_after: int | None = None) -> None:
        self.until: datetime | None = None
        self.renewals = 0
        self.failing_after = failing_after
        self.lock = threading.Lock()

    def renew(self, until: datetime) -> None:
        with self.lock:
            if self.failing_after is not None and self.renewals >= self.failing_after:
                raise ConnectionError("PostgreSQL unreachable")
            self.until = until
            self.renewals += 1


def now() -> datetime:
    return datetime.now(UTC)


def test_lease_is_renewed_every_third_of_it_until_the_holder_is_done():
    lease = Lease()
    with Heartbeat(lease.renew, LEASE, now) as heartbeat:
        assert lease.renewals == 1  # on entry: the holder's lease from the start
        for _ in range(20):  # two seconds: over two leases
            time.sleep(0.1)
            assert heartbeat.held()
            assert lease.until is not None and lease.until > now()
    done = lease.renewals
    assert done >= 4
    time.sleep(1.0)
    assert lease.renewals == done, "renewed after the holder was done"


def test_holder_whose_renewals_fail_stops_holding_before_its_lease_runs_out():
    lease = Lease(failing_after=1)
    with Heartbeat(lease.renew, LEASE, now) as heartbeat:
        assert heartbeat.held()
        # The time is read before asking: on a loaded machine the thread can be paused
        # between the two, and the lease is promised from the moment held() answers (CI
        # failed once by 0.5 ms, reading the time after it).
        while (asked_at := now()) and heartbeat.held():
            assert lease.until is not None and lease.until > asked_at + LEASE / 3
            time.sleep(0.01)
        assert lease.until is not None and lease.until > now(), "gave up before the lease lapsed"


def test_a_lease_written_with_the_claim_is_not_written_again_on_entry():
    lease = Lease()
    with Heartbeat(lease.renew, LEASE, now, written_at=time.monotonic()) as heartbeat:
        assert lease.renewals == 0 and heartbeat.held()
        time.sleep(0.45)
        assert lease.renewals == 1


def test_failure_of_the_first_renewal_is_the_holders_error():
    with pytest.raises(ConnectionError), Heartbeat(Lease(failing_after=0).renew, LEASE, now):
        pass
