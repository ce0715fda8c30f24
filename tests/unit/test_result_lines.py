"""The RESULT lines the e2e tests read, as they arrive when ranks share one pipe."""
from testing.results import results

LINE = "RESULT framework=pytorch rank={r} world=2 loss_before=2.330223 loss_after=0.133513 digest=d6d7e77fb764b807"


def test_lines_glued_by_an_unbuffered_print_are_two_results():
    # PYTHONUNBUFFERED=1: rank 0's newline came after rank 1's whole line.
    output = LINE.format(r=0) + LINE.format(r=1) + "\n\n"
    found = results(output)
    assert [(r.rank, r.digest, r.extra) for r in found] == [(0, "d6d7e77fb764b807", ""), (1, "d6d7e77fb764b807", "")]


def test_lines_glued_by_mpirun_tags_keep_their_extra_fields_apart():
    output = "[1,0]<stdout>:" + LINE.format(r=0) + " step=5[1,1]<stdout>:" + LINE.format(r=1) + " step=5\n"
    assert [(r.rank, r.extra) for r in results(output)] == [(0, "step=5"), (1, "step=5")]


def test_separate_lines_parse_unchanged():
    output = "noise\n" + LINE.format(r=1) + " resumed=3\n" + LINE.format(r=0) + "\n"
    assert [(r.rank, r.world, r.before, r.after, r.extra) for r in results(output)] == [
        (1, 2, 2.330223, 0.133513, "resumed=3"), (0, 2, 2.330223, 0.133513, "")]
