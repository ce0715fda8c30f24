"""bench/compare.py's arithmetic: medians over rounds per row, and the after/before table."""

import math

from bench.compare import medians, paired, spread, table


def launch(seconds_by_name):
    return {"launch": [{"nproc": 1, "name": n, "seconds": s} for n, s in seconds_by_name.items()]}


def test_medians_per_row_over_rounds_skip_failed_runs():
    rounds = [launch({"a": 1.0, "b": 4.0}), launch({"a": 3.0, "b": math.nan}), launch({"a": 2.0, "b": 6.0})]
    assert medians(rounds, "launch") == {(1, "a"): {"seconds": 2.0}, (1, "b"): {"seconds": 5.0}}


def test_table_gives_after_over_before_and_names_a_row_that_failed():
    before = {"launch": {(1, "a"): {"seconds": 2.0}, (1, "b"): {"seconds": 1.0}}}
    after = {"launch": {(1, "a"): {"seconds": 2.1}}}
    text, ratios = table(before, after, ["launch"])
    assert ratios == [("launch: 1 / a (seconds)", 2.1 / 2.0)]
    assert "| 1 / a | seconds | 2.000 | 2.100 | 1.050× |" in text and "| 1 / b | seconds | 1.0 | None | failed |" in text


def test_paired_ratios_are_taken_round_by_round_and_give_their_spread():
    """A slow round slows both checkouts: its pair still says 1.0, where medians of the raw
    figures would mix rounds of different speeds."""
    before = [launch({"a": 1.0}), launch({"a": 2.0}), launch({"a": 1.0}), launch({"a": math.nan})]
    after = [launch({"a": 1.0}), launch({"a": 2.2}), launch({"a": 1.0}), launch({"a": 1.0})]
    assert paired(before, after, "launch") == {(1, "a"): {"seconds": [1.0, 1.1, 1.0]}}
    assert spread([1.0, 1.1, 1.0]) == (1.0, 1.0, 1.05)
    text, _ = table({"launch": medians(before, "launch")}, {"launch": medians(after, "launch")}, ["launch"],
                    {"launch": paired(before, after, "launch")})
    assert "| 1.000× (1.000–1.050) |" in text
