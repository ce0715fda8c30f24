"""bench/horovod_suites.py's pure part: each rank's pytest summary, as horovodrun tags it."""

from bench import horovod_suites


def test_each_ranks_summary_is_read_under_mpirun_and_gloo_tags():
    text = ("[1,0]<stdout>:3 failed, 100 passed, 12 skipped, 5 warnings in 80.12s (0:01:20)\n"
            "[1,1]<stdout>:=== 103 passed, 12 skipped in 81.0s ===\n")
    assert horovod_suites.counts(text) == {0: {"failed": 3, "passed": 100, "skipped": 12, "warning": 5},
                                           1: {"passed": 103, "skipped": 12}}
    assert horovod_suites.counts("[0]<stdout>:1 error in 2.0s\n[1]<stdout>:1 passed, 2 errors in 2.1s") == \
        {0: {"error": 1}, 1: {"passed": 1, "error": 2}}
    assert horovod_suites.counts("[1,1]<stdout>:143 passed, 112 skipped, 131 warnings, 176 subtests passed in 236.76s"
                                 "\n[1,0]<stdout>:1 failed, 2 subtests failed, 3 subtests passed in 1.0s") == \
        {1: {"passed": 143, "skipped": 112, "warning": 131, "subtests_passed": 176},
         0: {"failed": 1, "subtests_failed": 2, "subtests_passed": 3}}
    assert horovod_suites.counts("[1,0]<stdout>:collected 10 items\nno summary: a rank never finished") == {}


def test_the_default_suites_follow_the_frameworks_horovod_is_built_for():
    assert horovod_suites.SUITES["pytorch"] == ["test_torch.py"]
    assert "test_tensorflow2_keras.py" in horovod_suites.SUITES["tensorflow"]
