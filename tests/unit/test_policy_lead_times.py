"""policy.lead_times: growth timed from the decision to the pass that serves it."""

from __future__ import annotations

from xpyd_controller.policy.lead_times import COLD_START, CONVERSION, LeadTimes


def test_a_conversion_and_a_cold_start_are_timed_until_the_pool_is_ready_at_its_size() -> None:
    lead = LeadTimes(timeout_s=600)
    lead.asked(0, supply=(1, 4), decided=(2, 3))  # prefill grows while decode shrinks: a conversion
    lead.observe(10, ready=(1, 3))
    assert lead.seconds == {}
    lead.observe(25, ready=(2, 3))
    assert lead.seconds == {CONVERSION: 25}
    assert not lead.cold_start_faster()  # one way measured only
    lead.asked(30, supply=(2, 3), decided=(2, 4))  # decode grows alone: a cold start
    lead.observe(35, ready=(2, 4))
    assert lead.seconds[COLD_START] == 5 and lead.cold_start_faster()
    lead.asked(40, supply=(2, 4), decided=(2, 5))
    lead.observe(85, ready=(2, 5))
    assert lead.seconds[COLD_START] == 25  # exponentially weighted: the latest counts half
    assert not lead.cold_start_faster()


def test_a_growth_undone_or_never_served_gives_no_sample() -> None:
    lead = LeadTimes(timeout_s=60)
    lead.asked(0, supply=(1, 1), decided=(3, 1))
    lead.asked(5, supply=(1, 1), decided=(2, 1))  # asked for less than the timed growth: dropped
    lead.observe(10, ready=(3, 1))
    assert lead.seconds == {}
    lead.asked(20, supply=(1, 1), decided=(1, 2))
    lead.observe(100, ready=(1, 1))  # past the timeout: a stuck pod, not slow capacity
    lead.observe(110, ready=(1, 2))
    assert lead.seconds == {}


def test_a_growth_still_waiting_says_how_long_its_way_takes_at_least() -> None:
    lead = LeadTimes(timeout_s=600)
    assert lead.waited_s(0) == {}
    lead.asked(10, supply=(1, 1), decided=(2, 1))  # a cold start
    lead.asked(40, supply=(1, 1), decided=(2, 2))  # decode grows too while prefill still waits
    assert lead.waited_s(100) == {COLD_START: 90}  # the longest wait
    lead.observe(130, ready=(2, 2))  # both served: nothing waits, the samples are kept
    assert lead.waited_s(140) == {} and lead.seconds == {COLD_START: 105}
