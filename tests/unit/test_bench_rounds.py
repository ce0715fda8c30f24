"""The benchmarks' round order (bench/procs.py): every tool gets its turn first."""

from bench.procs import rotated


def test_each_round_starts_with_the_next_tool_and_keeps_them_all():
    tools = ["ours", "aws", "s5cmd", "rclone"]
    rounds = [rotated(tools, r) for r in range(4)]
    assert [r[0] for r in rounds] == tools
    assert all(sorted(r) == sorted(tools) for r in rounds)
    assert rotated(tools, 5) == rounds[1] and rotated([], 3) == []


def test_two_runs_swap_every_round():
    assert [rotated(["plain", "secret"], r) for r in range(3)] == [
        ["plain", "secret"], ["secret", "plain"], ["plain", "secret"]]
