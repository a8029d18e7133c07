"""Checkpoints under an `s3://` run path, against a real S3 API server on loopback (moto's server
mode, started here): found from the object listing without a download, a partly uploaded one
waits, a re-uploaded or moved copy with the same content reruns nothing, credentials come from
the environment only and appear in no config, log or output."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import run_snakemake

from ckpteval.config import build_plan, load_config, validate_config
from ckpteval.errors import UserError

pytest.importorskip("snakemake_storage_plugin_s3")
boto3 = pytest.importorskip("boto3")
pytest.importorskip("moto.server")

#: The secret the server accepts: it must appear nowhere but the environment.
SECRET = "s3cr3t-ckpteval-do-not-log-7d1f"
KEY_ID = "ckpteval-test-key"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server on loopback; its endpoint URL."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        else:
            pytest.fail("moto server did not start")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def s3_server() -> Iterator[str]:
    with moto_server() as url:
        yield url


def set_s3_env(monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    """The storage plugin's variables for the test server, and nothing of boto3's own chain."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("SNAKEMAKE_STORAGE_S3_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("SNAKEMAKE_STORAGE_S3_ACCESS_KEY", KEY_ID)
    monkeypatch.setenv("SNAKEMAKE_STORAGE_S3_SECRET_KEY", SECRET)


@pytest.fixture
def s3_env(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    set_s3_env(monkeypatch, s3_server)
    return s3_server


def _client(endpoint: str):  # noqa: ANN202 - a boto3 client
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=KEY_ID,
        aws_secret_access_key=SECRET,
    )


def _bucket(endpoint: str, name: str) -> None:
    client = _client(endpoint)
    try:
        client.create_bucket(Bucket=name)
    except client.exceptions.BucketAlreadyOwnedByYou:
        pass


def _upload(endpoint: str, bucket: str, prefix: str, src: Path, skip: tuple[str, ...] = ()) -> None:
    client = _client(endpoint)
    for f in sorted(src.rglob("*")):
        if f.is_file() and f.name not in skip:
            client.upload_file(str(f), bucket, f"{prefix}/{f.relative_to(src)}")


def _put(endpoint: str, bucket: str, key: str, body: bytes = b"{}") -> None:
    _client(endpoint).put_object(Bucket=bucket, Key=key, Body=body)


def _plan(tmp_path: Path, path: str, allow_empty_runs: bool = True, **run: object):  # noqa: ANN202 - a Plan
    cfg = tmp_path / "s3.yaml"
    extra = "".join(f", {k}: {v}" for k, v in run.items())
    cfg.write_text(
        f"runs: {{s3run: {{path: '{path}'{extra}}}}}\n"
        "tasks: {arith: {}}\n"
        f"outdir: {tmp_path / 'results'}\n"
    )
    config = load_config(cfg)
    validate_config(config)
    return build_plan(config, tmp_path, allow_empty_runs=allow_empty_runs)


def test_checkpoints_are_found_from_the_listing_without_download(
    s3_env: str, demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _bucket(s3_env, "found")
    for name in ("step_300", "step_150"):
        _upload(s3_env, "found", f"runs/grpo/{name}", demo_dir / "run" / name)
    _put(s3_env, "found", "runs/grpo/notes.txt", b"not a checkpoint")
    plan = _plan(tmp_path, "s3://found/runs/grpo")
    ckpts = plan.runs["s3run"].checkpoints
    assert [(c.name, c.step) for c in ckpts] == [("step_150", 150), ("step_300", 300)]
    first = ckpts[0]
    assert first.url == "s3://found/runs/grpo/step_150"
    names = {o.rel for o in first.objects}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= names
    assert "trainer_state.json" not in names  # never downloaded, not in the identity
    local = demo_dir / "run" / "step_150" / "model.safetensors"
    (weights,) = [o for o in first.objects if o.rel == "model.safetensors"]
    assert weights.size == local.stat().st_size and weights.etag
    assert not (tmp_path / ".snakemake").exists(), "a parse downloaded something"


def test_a_partly_uploaded_checkpoint_waits(s3_env: str, tmp_path: Path) -> None:
    _bucket(s3_env, "partial")
    # An HF index and one shard of two; a verl actor with one rank shard of two; a DCP
    # checkpoint without its coordinator's .metadata; one with a trainer marker still to come.
    _put(s3_env, "partial", "run/step_10/config.json")
    _put(s3_env, "partial", "run/step_10/model.safetensors.index.json")
    _put(s3_env, "partial", "run/step_10/model-00001-of-00002.safetensors", b"x")
    _put(s3_env, "partial", "run/global_step_20/actor/fsdp_config.json")
    _put(s3_env, "partial", "run/global_step_20/actor/model_world_size_2_rank_0.pt", b"x")
    _put(s3_env, "partial", "run/step_30/__0_0.distcp", b"x")
    _put(s3_env, "partial", "run/step_40/config.json")
    _put(s3_env, "partial", "run/step_40/model.safetensors", b"x")
    plan = _plan(tmp_path, "s3://partial/run")
    assert [c.name for c in plan.runs["s3run"].checkpoints] == ["step_40"]
    lines = plan.waiting_lines(age=False)
    assert "run s3run: checkpoint step_10 waiting: being written (shard 2 of 2 not there yet)" in (
        lines
    )
    assert any("global_step_20" in line and "shard 2 of 2 not there yet" in line for line in lines)
    assert any("step_30" in line and ".metadata" in line for line in lines)
    marked = _plan(tmp_path, "s3://partial/run", complete_marker="DONE")
    assert marked.runs["s3run"].checkpoints == ()
    _put(s3_env, "partial", "run/step_40/DONE", b"")
    marked = _plan(tmp_path, "s3://partial/run", complete_marker="DONE")
    assert [c.name for c in marked.runs["s3run"].checkpoints] == ["step_40"]


def test_a_verl_checkpoints_template_on_s3_is_read_as_generation_reads_it(
    s3_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47: verl's tokenizer and template live in `actor/huggingface/`. Before download a
    checkpoint whose listing holds tokenizer files is not warned about (a parse downloads
    nothing), one with none is; once consolidated, the model the engine loads decides."""
    from ckpteval.chat_templates import missing_template_lines

    monkeypatch.chdir(tmp_path)
    _bucket(s3_env, "tmpl")
    template = json.dumps({"chat_template": "{{ messages[0]['content'] }}"}).encode()
    for step in (100, 200, 300):  # the listing is all a parse reads: names, sizes, ETags
        actor = f"grpo/global_step_{step}/actor"
        _put(s3_env, "tmpl", f"{actor}/fsdp_config.json", b'{"world_size": 2}')
        for rank in range(2):
            _put(s3_env, "tmpl", f"{actor}/model_world_size_2_rank_{rank}.pt", b"x")
        if step != 300:
            _put(s3_env, "tmpl", f"{actor}/huggingface/tokenizer_config.json", template)
    cfg = tmp_path / "tmpl.yaml"
    cfg.write_text(
        "runs: {grpo: {path: 's3://tmpl/grpo', base_model: base}}\n"
        "tasks: {arith: {chat_template: true}}\n"
        f"outdir: {tmp_path / 'results'}\n"
    )
    (tmp_path / "base").mkdir()  # a base model without a template: global_step_300 has none
    (tmp_path / "base" / "tokenizer_config.json").write_text("{}")
    config = load_config(cfg)
    validate_config(config)
    plan = build_plan(config, tmp_path)
    assert [c.name for c in plan.runs["grpo"].checkpoints] == [
        "global_step_100",
        "global_step_200",
        "global_step_300",
    ]
    (line,) = missing_template_lines(plan)
    assert line.startswith("run grpo: checkpoint(s) global_step_300 have no chat template")
    # Consolidated, the model decides: global_step_200's, made (say) without the template, has
    # none, whatever its listing holds.
    model = tmp_path / "results" / "models" / "grpo" / "global_step_200"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "tokenizer_config.json").write_text("{}")
    (line,) = missing_template_lines(plan)
    assert "checkpoint(s) global_step_200, global_step_300 have no chat template" in line
    assert not (tmp_path / ".snakemake").exists(), "a parse downloaded something"


def test_missing_credentials_and_bucket_are_one_line(
    s3_env: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(UserError) as err:
        _plan(tmp_path, "s3://no-such-bucket/run")
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("config: runs.s3run.path: s3://no-such-bucket/run: ")
    monkeypatch.delenv("SNAKEMAKE_STORAGE_S3_ACCESS_KEY")
    monkeypatch.delenv("SNAKEMAKE_STORAGE_S3_SECRET_KEY")
    with pytest.raises(UserError) as err:
        _plan(tmp_path, "s3://partial/run")
    assert "\n" not in str(err.value)
    assert "no S3 credentials; set SNAKEMAKE_STORAGE_S3_ACCESS_KEY" in str(err.value)


def test_a_prefix_without_checkpoints_says_what_it_holds(s3_env: str, tmp_path: Path) -> None:
    """A parent prefix (the experiment's, not the run's) is one line naming what is there, as
    a local parent directory's is: not "it is empty", which sends its user looking for an upload
    that is not missing."""
    _bucket(s3_env, "exps")
    _put(s3_env, "exps", "exp1/grpo/step_10/config.json")
    _put(s3_env, "exps", "exp1/notes.txt", b"a note")
    with pytest.raises(UserError) as err:
        _plan(tmp_path, "s3://exps/exp1", allow_empty_runs=False)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("config: runs.s3run.patterns: nothing in s3://exps/exp1 ")
    assert str(err.value).endswith("(it holds grpo, notes.txt)")
    with pytest.raises(UserError) as err:
        _plan(tmp_path, "s3://exps/exp2", allow_empty_runs=False)
    assert str(err.value).endswith("(it is empty)")


def _workflow_config(tmp_path: Path, path: str) -> Path:
    cfg = tmp_path / "s3.yaml"
    cfg.write_text(
        f"runs: {{s3run: {{path: '{path}'}}}}\n"
        "tasks: {arith: {}}\n"
        "consolidate: {smoke: none}\n"
        f"outdir: {tmp_path / 'results'}\n"
    )
    return cfg


@pytest.mark.slow
def test_consolidated_from_s3_once_and_a_moved_copy_reruns_nothing(
    s3_env: str, demo_dir: Path, tmp_path: Path
) -> None:
    """Its own small workflow (one checkpoint, consolidate only): the shared sweeps read local
    run directories, and this is the S3 path end to end."""
    _bucket(s3_env, "e2e")
    _upload(s3_env, "e2e", "a/run/step_150", demo_dir / "run" / "step_150")
    cfg = _workflow_config(tmp_path, "s3://e2e/a/run")
    target = str(tmp_path / "results" / "models" / "s3run" / "step_150.json")
    proc = run_snakemake(tmp_path, target, "--configfile", str(cfg), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = load_config(target)  # JSON is YAML
    assert manifest["source"] == "s3://e2e/a/run/step_150"  # not the downloaded copy
    assert manifest["source_files"]["model.safetensors"]["etag"]
    assert "trainer_state.json" not in manifest["source_files"]
    model = tmp_path / "results" / "models" / "s3run" / "step_150"
    assert (model / "config.json").is_file() and any(model.glob("*.safetensors"))
    # The same bytes uploaded again elsewhere (another bucket and prefix): nothing to redo.
    _bucket(s3_env, "e2e-moved")
    _upload(s3_env, "e2e-moved", "b/c/run/step_150", demo_dir / "run" / "step_150")
    _workflow_config(tmp_path, "s3://e2e-moved/b/c/run")
    dry = run_snakemake(tmp_path, "-n", target, "--configfile", str(cfg), timeout=300)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout[-3000:]
    # Other bytes under the same name: the consolidation is redone.
    _put(s3_env, "e2e-moved", "b/c/run/step_150/config.json", b'{"changed": 1}')
    dry = run_snakemake(tmp_path, "-n", target, "--configfile", str(cfg), timeout=300)
    assert "consolidate" in dry.stdout, dry.stdout[-3000:]
    # The secret is in the environment only: not in the config, a log, or what was printed.
    written = [p for p in tmp_path.rglob("*") if p.is_file() and ".snakemake/storage" not in str(p)]
    for path in written:
        assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in proc.stdout + proc.stderr + dry.stdout + dry.stderr
    shutil.rmtree(tmp_path / ".snakemake", ignore_errors=True)


def test_watch_picks_up_a_checkpoint_uploaded_later(
    s3_env: str, demo_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ckpteval.watch import complete_checkpoints, describe_new

    monkeypatch.chdir(tmp_path)
    _bucket(s3_env, "watch")
    cfg = _workflow_config(tmp_path, "s3://watch/run")
    assert complete_checkpoints(cfg, tmp_path) == frozenset()
    _upload(s3_env, "watch", "run/step_150", demo_dir / "run" / "step_150", skip=("config.json",))
    assert complete_checkpoints(cfg, tmp_path) == frozenset()  # config.json still to come
    _put(
        s3_env,
        "watch",
        "run/step_150/config.json",
        (demo_dir / "run/step_150/config.json").read_bytes(),
    )
    now = complete_checkpoints(cfg, tmp_path)
    assert now == frozenset({("s3run", "step_150")})
    assert describe_new(frozenset(), now) == "1 new checkpoint(s): s3run/step_150"
    assert os.environ["SNAKEMAKE_STORAGE_S3_SECRET_KEY"] not in cfg.read_text()


def test_the_local_root_of_a_checkpoint_is_its_copys_path_less_the_objects_name() -> None:
    """A verl checkpoint needs only objects below `actor/`: their common directory is not the
    checkpoint (consolidation looks for `actor/` in it); the listing identity's names say where
    the checkpoint starts. A single bare object is its own path."""
    from ckpteval.steps import _source_path

    root = ".snakemake/storage/s3/bkt/exp/global_step_5"
    rels = ["actor/model_world_size_2_rank_0.pt", "actor/huggingface/config.json"]
    identity = {"s3": True, "files": {rel: {"size": 1, "etag": "x"} for rel in rels}}
    assert _source_path([f"{root}/{rel}" for rel in rels], identity) == Path(root)
    assert _source_path([f"{root}/model.pt"], {"s3": True, "files": {"": {}}}) == Path(
        f"{root}/model.pt"
    )
    assert _source_path(str(root)) == Path(root)
