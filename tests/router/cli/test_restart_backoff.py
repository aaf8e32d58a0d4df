"""RestartBackoff: a worker that exits is started again at once, then ever later while it
keeps exiting soon after its start, and at once again after it has run a while."""

from tiergate.router.cli.supervisor import RestartBackoff


def test_a_worker_that_keeps_exiting_waits_longer_each_time_up_to_the_cap() -> None:
    backoff = RestartBackoff(first_s=1.0, max_s=30.0, stable_after_s=60.0)
    delays = [backoff.delay_s(ran_s=2.0) for _ in range(8)]
    assert delays == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


def test_a_worker_that_ran_a_while_is_started_again_at_once() -> None:
    backoff = RestartBackoff(first_s=1.0, max_s=30.0, stable_after_s=60.0)
    assert [backoff.delay_s(ran_s=1.0) for _ in range(3)] == [0.0, 1.0, 2.0]
    assert backoff.delay_s(ran_s=60.0) == 0.0
    assert backoff.delay_s(ran_s=1.0) == 1.0
