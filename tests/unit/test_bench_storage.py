"""bench/storage.py's round order: every tool gets its turn first."""

from bench.storage import rotated


def test_each_round_starts_with_the_next_tool_and_keeps_them_all():
    tools = ["ours", "aws", "s5cmd", "rclone"]
    rounds = [rotated(tools, r) for r in range(4)]
    assert [r[0] for r in rounds] == tools
    assert all(sorted(r) == sorted(tools) for r in rounds)
    assert rotated(tools, 5) == rounds[1] and rotated([], 3) == []
