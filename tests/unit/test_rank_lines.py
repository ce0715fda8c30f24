"""One rank prefix for every launcher (entrypoint/running/rank_lines.py)."""

import pytest

from entrypoint.running import rank_lines


@pytest.mark.parametrize("label, prefix", [("rank 3", "[rank3]: "), ("ps 0", "[ps0]: "), ("torchrun", "[torchrun]: "),
                                           ("", "")])
def test_a_process_label_becomes_one_prefix(label, prefix):
    assert rank_lines.prefix(label) == prefix


@pytest.mark.parametrize("line, expected", [
    ("loss 0.4\n", "[rank3]: loss 0.4\n"),                                   # a supervised rank
    ("[1,2]<stdout>:loss 0.4\n", "[rank2]: loss 0.4\n"),                     # mpirun --tag-output
    ("[1,12]<stderr>:Traceback\n", "[rank12]: Traceback\n"),
    ("[2]<stderr>: loss 0.4\n", "[rank2]: loss 0.4\n"),                      # horovodrun over Gloo
    ("[rank2]: [rank2]: Traceback\n", "[rank2]: Traceback\n"),               # torch's prefix inside torchrun's
    ("[rank2]: [rank2]: [rank2]: x\n", "[rank2]: x\n"),
    ("[rank2]: [rank3]: x\n", "[rank2]: [rank3]: x\n"),                      # another rank's words: kept
    ("[rank0]: hi\n", "[rank0]: hi\n"),
    ("[1,0]<stdout>:[rank0]: x\n", "[rank0]: x\n"),
    ("[rank 3] x\n", "[rank3]: [rank 3] x\n"),                               # not the prefix: the process's own added
])
def test_launchers_tags_and_doubled_prefixes_become_one(line, expected):
    assert rank_lines.tagged(line, "[rank3]: ") == expected
