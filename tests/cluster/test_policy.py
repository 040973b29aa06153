"""Our router's policy (serving/cluster/policy.py) and the replicas' reports it reads (stats.py), without Ray.

The router (serving/cluster/router.py) is this policy over Serve's replica list; its glue runs in the `ray`
tests (tests/cluster/test_ray.py). The reports here are made by a real `SetBook` from real results of the
tiny engine, and read back as the router reads them.
"""

from __future__ import annotations

import dataclasses

import pytest

from engine.requests import GenerateRequest, LoraSpec
from serving.cluster.policy import Costs, Ledger, ReplicaView, home_order, pool_costs, rank, service_s, set_cost
from serving.cluster.stats import DISK_REPORTED, ReplicaStats, SetBook, SetCost, read_stats
from serving.cluster.wire import adapter_set_id
from tests.support.checks import generate

# Inference dominates, as on a GPU: an image costs 1 s, loading a set elsewhere 0.3 s.
COSTS = Costs(inference_s=1.0, swap_s=0.05, prepare_s=0.1, download_s=0.2)
NOW = 1000.0


def stats(**fields: object) -> ReplicaStats:
    return ReplicaStats.model_validate({"at": NOW, **fields})


def views(*pairs: tuple[str, ReplicaStats | None]) -> list[ReplicaView]:
    return [ReplicaView(name, report) for name, report in pairs]


def best(replicas: list[ReplicaView], set_id: str, ledger: Ledger | None = None) -> str:
    return rank(replicas, set_id, ledger or Ledger(), COSTS, NOW)[0].replica


def test_a_set_goes_to_the_replica_that_holds_it_prepared_or_loading_or_as_serve_says():
    for held in ({"prepared": ["s"]}, {"loading": ["s"]}):
        replicas = views(("a", stats()), ("b", stats(**held)), ("c", stats()))
        assert best(replicas, "s") == "b"
    serve_says = [ReplicaView("a"), ReplicaView("b", serve_ids=frozenset({"s"}))]
    assert best(serve_says, "s") == "b"


def test_a_set_on_a_replicas_disk_costs_its_preparation_only():
    here = {"s": {"download_s": 5.0, "prepare_s": 0.1}}
    replicas = views(("a", stats()), ("b", stats(disk=here)))
    choices = rank(replicas, "s", Ledger(), COSTS, NOW)
    assert [c.replica for c in choices] == ["b", "a"]
    # On b: prepare, swap, inference; on a: the download b measured for this set as well.
    assert choices[0].service_s == pytest.approx(0.1 + 0.05 + 1.0)
    assert choices[1].service_s == pytest.approx(5.0 + 0.1 + 0.05 + 1.0)


def test_among_equals_each_set_has_a_home_and_the_homes_spread_over_the_replicas():
    replicas = views(("a", None), ("b", None), ("c", None))
    homes = {f"set-{i}": best(replicas, f"set-{i}") for i in range(60)}
    assert homes == {f"set-{i}": best(replicas, f"set-{i}") for i in range(60)}  # the same every time
    assert {home: list(homes.values()).count(home) for home in "abc"} == {
        home: pytest.approx(20, abs=10) for home in "abc"
    }
    assert homes["set-7"] == home_order("set-7", ["c", "a", "b"])[0]


def test_requests_for_one_set_do_not_pile_onto_its_holder():
    ledger = Ledger()
    replicas = views(("a", stats(prepared=["s"], fused="s")), ("b", stats()), ("c", stats()))
    sent = []
    for i in range(6):
        choice = rank(replicas, "s", ledger, COSTS, NOW)[0]
        ledger.send(f"r{i}", choice.replica, "s", choice.service_s, NOW)
        sent.append(choice.replica)
    # The holder takes the first; once its queue costs more than loading the set elsewhere (1 s against
    # 0.35 s), the next ones go elsewhere, and the set, queued there, costs nothing more to load there either.
    assert sent[0] == "a"
    assert set(sent) == {"a", "b", "c"}
    assert max(sent.count(r) for r in "abc") == 2


def test_the_queue_is_what_was_sent_less_what_has_run_since_the_head_started():
    ledger = Ledger()
    ledger.send("r1", "a", "s", 2.0, NOW)
    ledger.send("r2", "a", "t", 1.0, NOW + 0.5)
    assert ledger.remaining_s("a", NOW + 1.0) == pytest.approx(2.0)
    assert ledger.queued("a") == (2, frozenset({"s", "t"}))
    ledger.done("r1", NOW + 2.0)  # the second starts now
    assert ledger.remaining_s("a", NOW + 2.5) == pytest.approx(0.5)
    ledger.done("r2", NOW + 3.0)
    assert ledger.remaining_s("a", NOW + 3.0) == 0.0 and ledger.queued("a") == (0, frozenset())


def test_serve_moving_a_request_moves_it_in_the_ledger_and_unconfirmed_choices_expire():
    ledger = Ledger(unconfirmed_ttl_s=10.0)
    ledger.send("r1", "a", "s", 1.0, NOW)
    ledger.confirm("r1", "b", 1.5, NOW)  # a was full: Serve sent it to the next rank
    assert ledger.queued("a") == (0, frozenset()) and ledger.queued("b") == (1, frozenset({"s"}))
    ledger.send("r2", "a", "t", 1.0, NOW)  # its caller goes away before Serve sends it anywhere
    assert ledger.remaining_s("a", NOW + 11.0) == 0.0
    assert ledger.remaining_s("b", NOW + 11.0) == 0.0  # done long ago by its estimate, still counted as queued
    assert ledger.queued("b") == (1, frozenset({"s"}))
    ledger.forget_replica("b")  # it died
    assert ledger.queued("b") == (0, frozenset())


def test_a_replica_whose_report_went_stale_comes_last_even_holding_the_set():
    replicas = [ReplicaView("a", stats(prepared=["s"]), stale=True), ReplicaView("b", stats())]
    assert [c.replica for c in rank(replicas, "s", Ledger(), COSTS, NOW)] == ["b", "a"]


def test_the_swap_is_free_only_for_the_set_fused_on_an_idle_replica():
    fused = ReplicaView("a", stats(prepared=["s"], fused="s"))
    costs = COSTS
    cost = SetCost(download_s=0.2, prepare_s=0.1)
    assert service_s(fused, "s", (0, frozenset()), costs, cost) == pytest.approx(1.0)
    assert service_s(fused, "s", (1, frozenset({"t"})), costs, cost) == pytest.approx(1.05)
    assert service_s(fused, "", (0, frozenset()), costs, cost) == pytest.approx(1.05)


def test_the_pools_costs_are_the_means_of_fresh_reports_else_the_defaults():
    measured = [
        ReplicaView("a", stats(measured={"inference_s": 0.4, "swap_s": 0.01})),
        ReplicaView("b", stats(measured={"inference_s": 0.6})),
        ReplicaView("c", stats(measured={"inference_s": 9.0}), stale=True),
        ReplicaView("d"),
    ]
    assert pool_costs(measured, COSTS) == dataclasses.replace(COSTS, inference_s=0.5, swap_s=0.01)
    known = [ReplicaView("a", stats(disk={"s": {"download_s": 3.0, "prepare_s": 0.2}})), ReplicaView("b")]
    assert set_cost(known, "s", COSTS) == SetCost(download_s=3.0, prepare_s=0.2)
    assert set_cost(known, "t", COSTS) == SetCost(download_s=0.2, prepare_s=0.1)


def test_a_report_that_does_not_fit_is_no_report():
    assert read_stats({}) is None and read_stats(None) is None
    assert read_stats({"prepared": ["s"]}) is None  # no time
    assert read_stats({"at": NOW, "disk": {"s": {"download_s": -1, "prepare_s": 0}}}) is None
    assert read_stats({"at": NOW, "newer_field": 1}) == stats()


def test_the_replicas_book_reports_what_its_results_say(engine, fixtures):
    book = SetBook()
    request = GenerateRequest(prompt="a fox", loras=(LoraSpec(fixtures["second"]),), steps=1, seed=3)
    set_id = adapter_set_id(request)
    book.started(set_id)
    report = read_stats(book.report())
    assert report is not None and report.loading == {set_id} and not report.prepared
    first = generate(engine, request)
    book.finished(set_id, first)
    book.held(set_id)
    book.started(set_id)
    second = generate(engine, request)
    book.finished(set_id, second)
    report = read_stats(book.report(now=NOW))
    assert report is not None
    assert (report.at, report.prepared, report.loading, report.fused) == (NOW, {set_id}, set(), set_id)
    # The first result was a miss: its resolve (with the download) and preparation are the set's costs.
    assert first.adapters[0].cache == "miss" and second.adapters[0].cache == "hit"
    assert report.disk == {set_id: SetCost(download_s=first.timings.resolve, prepare_s=first.timings.prepare)}
    assert report.measured.inference_s == pytest.approx(0.8 * first.timings.inference + 0.2 * second.timings.inference)
    assert report.measured.download_s == pytest.approx(first.timings.resolve)
    book.evicted(set_id)
    book.started(set_id)
    book.finished(set_id, None)  # a failure measures nothing
    assert read_stats(book.report()).prepared == frozenset()  # type: ignore[union-attr]


def test_the_book_reports_a_bounded_disk_the_most_recent_sets_kept(engine):
    book = SetBook()
    # A real result, told it missed one LoRA: each set then counts as downloaded here.
    result = generate(engine, GenerateRequest(prompt="a fox", steps=1, seed=1))
    miss = dataclasses.replace(result, adapters=(_use("miss"),))
    for i in range(DISK_REPORTED + 5):
        book.started(f"s{i}")
        book.finished(f"s{i}", miss)
    disk = read_stats(book.report()).disk  # type: ignore[union-attr]
    assert len(disk) == DISK_REPORTED and "s0" not in disk and f"s{DISK_REPORTED + 4}" in disk


def _use(cache: str):
    from engine.requests import AdapterUse

    return AdapterUse("someone/lora", "main", "lora.safetensors", 1.0, cache)  # type: ignore[arg-type]
