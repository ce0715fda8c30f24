"""A node's outcome: states, the exit codes they mean, and their form in the job store."""

import signal

from entrypoint.running.outcome import NodeState, Outcome


def test_exit_codes_come_from_the_state():
    assert Outcome.succeeded().code == 0
    assert Outcome.stopped(signal.SIGTERM).code == 143 and Outcome.stopped(signal.SIGINT).code == 130
    assert Outcome.failed("x", 7).code == 7 and Outcome.failed("x", 0).code == 1
    assert Outcome.lost("gone").code == 1


def test_a_process_killed_by_a_signal_reports_128_plus_the_signal():
    killed = Outcome.of_process("rank 0", -signal.SIGKILL)
    assert (killed.state, killed.code) == (NodeState.FAILED, 137) and "killed by SIGKILL" in killed.reason
    assert Outcome.of_process("rank 1", 3).reason == "rank 1 exited with 3"
    assert Outcome.of_process("rank 1", 0).ok


def test_what_an_outcome_means_for_the_other_nodes():
    stopped = Outcome.stopped(signal.SIGTERM).aborting()
    assert (stopped.state, stopped.code, stopped.cause) == (NodeState.ABORTED, 143, NodeState.STOPPED)
    assert stopped.on_purpose
    failed = Outcome.failed("rank 0 exited with 9", 9).aborting()
    assert (failed.code, failed.on_purpose) == (9, False)          # the job's code is the failed rank's
    assert Outcome.lost("node 1 lost").aborting().code == 1
    assert not Outcome.left(signal.SIGTERM).ends_job and Outcome.lost("x").ends_job


def test_outcomes_travel_as_json():
    for outcome in (Outcome.succeeded(), Outcome.stopped(signal.SIGTERM).aborting(), Outcome.lost("master gone"),
                    Outcome.left(signal.SIGTERM)):
        assert Outcome.from_json(outcome.to_json()) == outcome
