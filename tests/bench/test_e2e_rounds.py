"""The e2e harness's time budget: a round (one repeat of a point, every system on the same
trace) is measured whole or not at all, so a call cut short by ``--budget-s`` never leaves a
system with a trace the others did not run (a floor without peers, or peers without it)."""

import pytest

from bench.e2e import cpu_pinning, plan, runner


class LiveServer:
    def alive(self) -> bool:
        return True


class Clock:
    """The harness's clock: a measurement advances it by the time it is expected to take."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:  # the wall clock: the same fake time, from the epoch
        return 1.8e9 + self.now


@pytest.fixture()
def clock(monkeypatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(runner, "time", fake)
    return fake


@pytest.fixture()
def measured(monkeypatch, clock):
    """The (system, seed) of each measurement made, in order."""
    done = []

    def measure_one(server, system, point, names, seed, clients, cpus=None):
        done.append((system.name, seed, cpus))
        clock.now += runner._expected_s(point)
        return {"metrics": {}}

    monkeypatch.setattr(runner, "measure_one", measure_one)
    monkeypatch.setattr(runner, "_line", lambda m, entry: "")
    return done


def run(tmp_path, clock: Clock, budget_rounds: float, pinning: dict | None = None) -> dict:
    call = plan.get_call("mixed-skewed-blocks", systems=["nolora", "vlora", "csgmv"], repeats=3)
    point = plan.scaled(plan.points_of("gpu")["sgl-mixed"], call.scale_requests)
    one_round = 3 * runner._expected_s(point)
    report = {"measurements": [], "systems": {s: {} for s in call.systems}, "_t0": clock.now,
              "setup": {"cpu_pinning": pinning}}
    live = {s: LiveServer() for s in call.systems}
    deadline = clock.now + budget_rounds * one_round
    runner.run_measurements(report, call, live, ["l00"], 100, deadline, tmp_path / "r.json", None)
    return report


def statuses(report: dict) -> list[tuple[str, int, str]]:
    return [(m["system"], m["repeat"], m["status"]) for m in report["measurements"]]


def test_a_round_that_does_not_fit_whole_is_skipped_whole(tmp_path, clock, measured):
    report = run(tmp_path, clock, budget_rounds=0.9)  # not even the first round fits whole
    assert measured == []
    assert {status for _, _, status in statuses(report)} == {"skipped"}
    assert all("a round runs whole or not at all" in m["reason"] for m in report["measurements"])


def test_the_rounds_that_fit_run_every_system_on_their_trace(tmp_path, clock, measured):
    report = run(tmp_path, clock, budget_rounds=2.5)  # two whole rounds, half of a third
    ran = [(s, r) for s, r, status in statuses(report) if status == "ok"]
    assert sorted(ran) == sorted((s, r) for s in ("nolora", "vlora", "csgmv") for r in (0, 1))
    assert {seed for _, seed, _ in measured} == {100, 101}  # each round is one trace: seed + repeat
    # and its results say which: the report draws the rounds of one trace together
    assert {(m["repeat"], m["trace_seed"]) for m in report["measurements"] if m["status"] == "ok"} == {(0, 100), (1, 101)}
    started = [(m["started_at_s"], m["started_at_unix"]) for m in report["measurements"] if m["status"] == "ok"]
    assert started and all(unix == pytest.approx(1.8e9 + 1000.0 + s, abs=0.1) for s, unix in started)  # wall clock
    assert [status for _, r, status in statuses(report) if r == 2] == ["skipped"] * 3


def test_a_pinned_call_moves_the_servers_blocks_one_along_each_round_and_records_them(tmp_path, clock, measured,
                                                                                      monkeypatch):
    moves = []

    def repin_servers(live, pinning, round_index):  # the real one moves processes: tests/bench/test_cpu_pinning.py
        moves.append(round_index)
        return cpu_pinning.blocks_for_round(pinning, round_index)

    monkeypatch.setattr(runner, "repin_servers", repin_servers)
    pinning = cpu_pinning.assign(list(range(7)), ["nolora", "vlora", "csgmv"], 2)
    report = run(tmp_path, clock, budget_rounds=2.5, pinning=pinning)
    assert moves == [0, 1]  # once a round that runs, none for the round skipped
    cpus = {(m["system"], m["repeat"]): m.get("cpus") for m in report["measurements"]}
    assert cpus[("nolora", 0)] == [0, 1] and cpus[("nolora", 1)] == [2, 3]
    assert cpus[("csgmv", 0)] == [4, 5] and cpus[("csgmv", 1)] == [0, 1]
    assert all(cpus[(s, 2)] is None for s in ("nolora", "vlora", "csgmv"))
    # the probe and the host figures of a measurement are taken on the CPUs it ran on
    assert all(used == cpus[(name, seed - 100)] for name, seed, used in measured)


def test_an_unpinned_call_moves_nothing(tmp_path, clock, measured, monkeypatch):
    monkeypatch.setattr(runner, "repin_servers", lambda *a: pytest.fail("moved servers of an unpinned call"))
    report = run(tmp_path, clock, budget_rounds=1.5)
    assert all("cpus" not in m for m in report["measurements"])
    assert all(used is None for _, _, used in measured)
