"""Object storage's pure parts: bucket URLs in the contract, what a node stages, what a
resume takes from the manifests, and what the mirror says (entrypoint/storage/)."""

import pickle

import pytest

from entrypoint.contract.config import ConfigError, load_config
from entrypoint.contract.manifest import Image
from entrypoint.contract.urls import BucketUrl, UrlError, parse_bucket_url
from entrypoint.machine import writable_dirs
from entrypoint.storage import manifest
from entrypoint.storage.client import StorageError
from entrypoint.storage.mirror import MirrorReport, open_for_writing, report_line, scan
from entrypoint.storage.shards import shard_files
from entrypoint.storage.stage import plan_stage
from entrypoint.storage.transfer import Obj, Progress


def config(**env):
    return load_config({k: str(v) for k, v in env.items()}, Image(["pytorch"], ["native"]))


@pytest.mark.parametrize("text, bucket, prefix", [
    ("s3://data", "data", ""), ("s3://data/", "data", ""), ("s3://my.data-1/a/b", "my.data-1", "a/b/"),
    ("S3://data/a/b/", "data", "a/b/"), ("oss://ckpt-bucket/run", "ckpt-bucket", "run/")])
def test_bucket_urls_parse_to_bucket_and_a_prefix_ending_in_a_slash(text, bucket, prefix):
    url = parse_bucket_url(text)
    assert (url.bucket, url.prefix) == (bucket, prefix)
    assert url.key("x.pt") == prefix + "x.pt" and url.relative(prefix + "x.pt") == "x.pt"


@pytest.mark.parametrize("text, says", [
    ("gs://b/x", "scheme gs:// is not supported; allowed: a folder, s3://"), ("s3://", "bucket '' is not"),
    ("s3://ab/x", "bucket 'ab' is not"), ("s3://Upper/x", "bucket 'Upper'"), ("s3://a_b_c/x", "bucket 'a_b_c'"),
    ("s3://bucket/../up", "prefix '../up' has empty, '.' or '..' parts"),
    ("s3://bucket/a//b", "prefix 'a//b' has empty")])
def test_bad_bucket_urls_say_what_is_wrong(text, says):
    with pytest.raises(UrlError) as err:
        parse_bucket_url(text)
    assert says in str(err.value)


def test_a_bucket_url_becomes_a_folder_in_cache_dir_and_the_script_sees_the_folder():
    c = config(DATA_DIR="s3://sets/imagenet", CHECKPOINT_DIR="s3://runs/job-7", CACHE_DIR="/scratch")
    assert c.data_dir == "/scratch/data/sets/imagenet" and c.data_url == BucketUrl("s3", "sets", "imagenet/")
    assert c.checkpoint_dir == "/scratch/checkpoints/runs/job-7" and str(c.checkpoint_url) == "s3://runs/job-7/"
    plain = config(DATA_DIR="/mnt/data")
    assert plain.data_dir == "/mnt/data" and plain.data_url is None and plain.checkpoint_url is None


@pytest.mark.parametrize("env, line", [
    ({"DATA_DIR": "http://x/y"}, "DATA_DIR='http://x/y': scheme http:// is not supported"),
    ({"CHECKPOINT_DIR": "s3://UP/x"}, "CHECKPOINT_DIR='s3://UP/x': bucket 'UP' is not a bucket name"),
    ({"DATA_DIR": "s3://same/p", "CHECKPOINT_DIR": "s3://same/p/"}, "CHECKPOINT_DIR='s3://same/p/': must not be the same"),
    ({"CACHE_DIR": "cache"}, "CACHE_DIR='cache': must be an absolute path"),
    ({"S3_ADDRESSING_STYLE": "dns"}, "S3_ADDRESSING_STYLE='dns'")])
def test_bad_storage_variables_are_one_line_naming_the_variable(env, line):
    with pytest.raises(ConfigError) as err:
        config(**env)
    assert str(err.value).startswith(line) and "\n" not in str(err.value)


def test_an_unwritable_default_cache_falls_back_to_the_temporary_folder_but_a_chosen_one_is_an_error(tmp_path):
    refuse = lambda folder: "Read-only file system" if folder.startswith("/app") else None   # noqa: E731
    assert writable_dirs.object_cache({}, "/app/cache", refuse).endswith(f"disttrain-cache-{__import__('os').getuid()}")
    assert writable_dirs.object_cache({}, str(tmp_path), refuse) is None
    with pytest.raises(ConfigError) as err:
        writable_dirs.object_cache({"CACHE_DIR": "/app/cache"}, "/app/cache", refuse)
    assert str(err.value).startswith("CACHE_DIR='/app/cache': not writable by uid")


URL = BucketUrl("s3", "data", "set/")


def test_staging_fetches_what_is_missing_or_changed_keeps_the_rest_and_drops_what_the_bucket_lost():
    listing = [Obj("set/a.bin", 10, "e1"), Obj("set/sub/b.bin", 20, "e2"), Obj("set/c.bin", 30, "e3"),
               Obj("set/d.bin", 40, "e4")]
    index = {"a.bin": [10, "e1"], "sub/b.bin": [20, "old"], "c.bin": [30, "e3"], "gone.bin": [5, "e9"]}
    on_disk = {"a.bin": 10, "sub/b.bin": 20, "c.bin": 29}.get          # c.bin: a torn copy
    plan = plan_stage(URL, listing, index, on_disk)
    assert [rel for rel, _ in plan.kept] == ["a.bin"]
    assert [rel for rel, _ in plan.fetch] == ["sub/b.bin", "c.bin", "d.bin"] and plan.fetch_bytes == 90
    assert plan.remove == ("gone.bin",)


@pytest.mark.parametrize("key", ["set/../escape", "set//abs", "set/.disttrain-cache.json"])
def test_an_object_that_would_land_outside_the_data_folder_is_refused(key):
    with pytest.raises(StorageError):
        plan_stage(URL, [Obj(key, 1, "e")], {}, lambda rel: None)


def entries(*names):
    return {n: manifest.Entry(1, "h") for n in names}


def test_a_resume_takes_the_newest_complete_checkpoint_of_each_kind_and_the_other_files():
    files = entries("ckpt-00000010.pt", "ckpt-00000020.pt", "ckpt-00000005.pkl",
                    "ckpt-00000010.dcp/__0_0.distcp", "ckpt-00000010.dcp/.metadata",
                    "ckpt-00000020.dcp/__0_0.distcp",                   # no metadata: not complete
                    "notes.txt", "diagnostics/incident-1/node0.txt")
    assert set(manifest.resume_set(files)) == {"ckpt-00000020.pt", "ckpt-00000005.pkl", "ckpt-00000010.dcp/__0_0.distcp",
                                               "ckpt-00000010.dcp/.metadata", "notes.txt"}


def shards_of(step, *ranks, parts=True):
    top = f"ckpt-{step:08d}.dcp"
    named = tuple(f"{top}/__{r}_0.distcp" for r in ranks)
    return {**{n: manifest.Entry(1, "h") for n in named},
            f"{top}/.metadata": manifest.Entry(1, "m", parts=named if parts else None)}


def test_a_sharded_checkpoint_counts_once_every_nodes_shards_are_listed():
    node0 = {k: v for k, v in shards_of(20, 0, 1, 2, 3).items() if "__2" not in k and "__3" not in k}
    node1 = {k: v for k, v in shards_of(20, 0, 1, 2, 3).items() if "__2" in k or "__3" in k}
    older = shards_of(10, 0, 1, 2, 3)
    assert manifest.complete_units(manifest.merge([older, node0])) == {"dcp": [(10, "ckpt-00000010.dcp")]}
    assert set(manifest.resume_set(manifest.merge([older, node0]))) == set(older)
    both = manifest.merge([older, node0, node1])
    assert manifest.complete_units(both)["dcp"][-1] == (20, "ckpt-00000020.dcp")
    assert manifest.complete_units(shards_of(5, 0, parts=False)) == {"dcp": [(5, "ckpt-00000005.dcp")]}  # names unknown
    again = manifest.decode(manifest.encode(0, node0, "run"))
    assert again["ckpt-00000020.dcp/.metadata"].parts == node0["ckpt-00000020.dcp/.metadata"].parts


def test_an_older_sharded_checkpoint_is_deleted_only_once_a_newer_one_is_complete():
    older, newer = shards_of(10, 0, 1), shards_of(20, 0, 1)
    torn = {k: v for k, v in newer.items() if "__1" not in k}
    assert not manifest.may_delete("ckpt-00000010.dcp/__0_0.distcp", manifest.merge([older, torn]))
    assert not manifest.may_delete("ckpt-00000010.dcp/.metadata", manifest.merge([older, torn]))
    assert manifest.may_delete("ckpt-00000010.dcp/__0_0.distcp", manifest.merge([older, newer]))
    assert not manifest.may_delete("ckpt-00000020.dcp/__0_0.distcp", manifest.merge([older, newer]))
    assert manifest.may_delete("ckpt-00000010.pt", {}) and manifest.may_delete("notes.txt", {})


class StorageInfo:                                  # the shape of DCP's _StorageInfo
    def __init__(self, path):
        self.relative_path, self.offset, self.length = path, 0, 8


def test_the_shard_names_come_from_the_metadata_pickle_without_running_it(tmp_path):
    meta = {"storage_data": {i: StorageInfo(f"__{i % 2}_0.distcp") for i in range(4)}, "planner": "x.distcp/../y"}
    (tmp_path / ".metadata").write_bytes(pickle.dumps(meta))
    assert shard_files(str(tmp_path / ".metadata")) == ("__0_0.distcp", "__1_0.distcp")
    (tmp_path / "bad").write_bytes(b"not a pickle")
    assert shard_files(str(tmp_path / "bad")) is None


def test_without_the_projects_naming_a_resume_takes_every_file_and_the_manifests_merge():
    keras = entries("chief/checkpoint", "chief/ckpt-1.index", "chief/ckpt-1.data-00000-of-00001")
    assert manifest.resume_set(keras) == keras
    merged = manifest.merge([entries("a"), {"a": manifest.Entry(2, "x"), **entries("b")}])
    assert merged == {"a": manifest.Entry(2, "x"), "b": manifest.Entry(1, "h")}
    body = manifest.encode(3, merged, "run")
    assert manifest.decode(body) == merged and manifest.node_key("p/", 3) == "p/.disttrain/nodes/3.json"


def test_the_mirror_sees_finished_files_only_and_which_are_open_for_writing(tmp_path):
    (tmp_path / "ckpt-00000001.pt").write_bytes(b"1")
    (tmp_path / ".ckpt-00000002.pt.tmp-7").write_bytes(b"2")
    (tmp_path / "chief").mkdir()
    (tmp_path / "chief" / "checkpoint").write_bytes(b"3")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "x").write_bytes(b"4")
    assert set(scan(str(tmp_path))) == {"ckpt-00000001.pt", "chief/checkpoint"}
    with open(tmp_path / "chief" / "checkpoint", "ab"), open(tmp_path / "ckpt-00000001.pt", "rb"):
        assert open_for_writing(str(tmp_path)) == {"chief/checkpoint"}
    assert open_for_writing(str(tmp_path)) == set()


def test_the_mirrors_last_line_says_what_is_in_the_bucket_and_what_is_not():
    url = BucketUrl("s3", "runs", "j/")
    ok = report_line(url, "/c", MirrorReport(3, 3 * 2**20, 1, 0, (), None))
    assert ok == "checkpoints: uploaded 3 files (3.0 MiB), removed 1 pruned to s3://runs/j/; everything finished is in the bucket"
    waiting = report_line(url, "/c", MirrorReport(3, 3 * 2**20, 0, 2, (), None))
    assert "kept 2 pruned shards until the other nodes' newer ones are up" in waiting and "everything finished" in waiting
    bad = report_line(url, "/c", MirrorReport(1, 10, 0, 0, ("ckpt-00000002.pt",), "AccessDenied (Access Denied) from X"))
    assert "NOT uploaded: ckpt-00000002.pt: AccessDenied (Access Denied) from X; the local copy stays in /c" in bad


def test_progress_lines_give_files_bytes_rate_and_eta_at_most_every_few_seconds():
    said = []
    p = Progress("data", 4, 4 * 2**20, said.append, every=0.0)
    p.add(2**20)
    p.file_done()
    p.tick()
    assert said and said[0].startswith("data: 1/4 files, 1.0 MiB/4.0 MiB, ") and " MB/s, ETA " in said[0]
    quiet = Progress("data", 1, 1, said.append, every=60.0)
    quiet.tick()
    assert len(said) == 1


def test_a_file_rewritten_in_place_is_listed_with_both_digests_and_a_resume_accepts_either():
    entry = manifest.Entry(10, "old", next_size=12, next_sha256="new")
    assert entry.accepts(10, "old") and entry.accepts(12, "new") and not entry.accepts(10, "new")
    again = manifest.decode(manifest.encode(0, {"chief/checkpoint": entry}, "run"))
    assert again["chief/checkpoint"] == entry
    assert not manifest.Entry(10, "old").accepts(12, "new")
