"""Checkpoints under an `s3://bucket/prefix` run path, found from the object listing alone.

A parse must stay cheap, so nothing is downloaded to discover checkpoints: the listing (keys,
sizes, ETags, last-modified times) says which checkpoints exist, whether each is completely
uploaded, and what its content is. An S3 object appears only once its upload has finished
(multipart uploads too), so "complete" is a question of which objects are there: the format's
shards, its completion marker. The identity of a checkpoint is the (name, size, ETag) of each
object consolidation reads: a copy re-uploaded or moved to another prefix with the same content
has the same identity and reruns nothing.

The listing goes through Snakemake's S3 storage plugin (snakemake-storage-plugin-s3): its
provider's boto3 client, configured as Snakemake configures it (the same `SNAKEMAKE_STORAGE_S3_*`
variables, else boto3's own chain: `AWS_ACCESS_KEY_ID`, `~/.aws`). The consolidate job's inputs
are the plugin's storage files, so Snakemake downloads exactly those objects before the job runs.
Credentials are read from the environment only: never from the config, never written anywhere.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpteval.errors import UserError

#: Where Snakemake's storage support puts the local copies of the `s3` storage's objects
#: (`--local-storage-prefix`, default `.snakemake/storage`, then the storage's name).
LOCAL_PREFIX = Path(".snakemake/storage/s3")

#: Files a trainer writes beside the model that consolidation never reads: never listed in a
#: checkpoint's identity, never downloaded.
TRAINER_STATE = re.compile(
    r"(^|/)(optimizer\.pt|scheduler\.pt|rng_state[^/]*\.pth|trainer_state\.json|"
    r"training_args\.bin|optim_[^/]*|extra_state_[^/]*|[^/]*_optim_states\.pt)\Z|^critic/"
)
VERL_SHARD = re.compile(r"(?:actor/)?model_world_size_(\d+)_rank_(\d+)\.pt\Z")
#: DeepSpeed ZeRO's files (ckpteval.formats.deepspeed): its optimizer states hold the fp32
#: master weights, which are the checkpoint's model, so they are read (and downloaded).
ZERO_MODEL = re.compile(r"(?:zero_pp_rank_\d+_)?mp_rank_\d+_model_states\.pt\Z")
ZERO_OPTIM = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt\Z")
OF_N_SHARD = re.compile(r"(.*)-(\d+)-of-(\d+)\.(safetensors|bin)\Z")
BARE_SUFFIXES = (".pt", ".pth", ".bin")


def is_s3(path: Any) -> bool:
    return isinstance(path, str) and path.startswith("s3://")


def split_url(url: str) -> tuple[str, str]:
    """`s3://bucket/a/b/` -> (`bucket`, `a/b`)."""
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not bucket:
        raise UserError(f"{url}: an S3 path needs a bucket (s3://bucket/prefix)")
    return bucket, prefix.strip("/")


def local_path(url: str) -> Path:
    """Where Snakemake's S3 storage puts the local copy of `url` (relative to the workdir)."""
    bucket, prefix = split_url(url)
    return LOCAL_PREFIX / bucket / prefix if prefix else LOCAL_PREFIX / bucket


@dataclass(frozen=True)
class S3Object:
    """One object of a checkpoint: `rel` is its key below the checkpoint's prefix."""

    rel: str
    size: int
    etag: str
    modified: float


@dataclass(frozen=True)
class S3Entry:
    """A candidate checkpoint under a run's prefix: a "directory" or one bare `.pt` object."""

    name: str
    url: str
    objects: tuple[S3Object, ...]
    bare: bool = False

    @property
    def files(self) -> dict[str, S3Object]:
        return {o.rel: o for o in self.objects}

    def object_url(self, obj: S3Object) -> str:
        return f"{self.url}/{obj.rel}" if obj.rel else self.url

    def needed(self) -> tuple[S3Object, ...]:
        """The objects consolidation reads (what is downloaded, what the identity covers)."""
        if any(ZERO_MODEL.match(o.rel) for o in self.objects):
            return self.objects
        return tuple(o for o in self.objects if not TRAINER_STATE.search(o.rel))

    def identity(self) -> dict[str, dict[str, Any]]:
        """`{rel: {"size": ..., "etag": ...}}` of the objects consolidation reads."""
        return {o.rel: {"size": o.size, "etag": o.etag} for o in self.needed()}

    def idle_seconds(self) -> float:
        newest = max((o.modified for o in self.objects), default=0.0)
        return max(0.0, time.time() - newest)


def _settings() -> dict[str, str | None]:
    """The storage plugin's settings, from the variables Snakemake reads them from."""
    names = ("endpoint_url", "region", "access_key", "secret_key", "token")
    out = {n: os.environ.get(f"SNAKEMAKE_STORAGE_S3_{n.upper()}") for n in names}
    out["region"] = out["region"] or "us-east-1"
    return out


def _bucket(bucket: str) -> Any:
    """The bucket through the storage plugin's provider (its boto3 resource)."""
    import logging

    from snakemake_storage_plugin_s3 import StorageProvider, StorageProviderSettings

    # The provider makes its local prefix; the listing downloads nothing, so not in the workdir.
    provider = StorageProvider(
        local_prefix=Path(tempfile.gettempdir()) / "ckpteval-s3-listing",
        logger=logging.getLogger("ckpteval.s3"),
        settings=StorageProviderSettings(**_settings()),
    )
    return provider.s3c.Bucket(bucket)


def list_objects(url: str, where: str) -> list[tuple[str, int, str, float]]:
    """(key below the prefix, size, ETag, last-modified) of every object under `url`; any
    failure (no credentials, no bucket, no server) is one line naming `where` and the fix."""
    import botocore.exceptions

    bucket, prefix = split_url(url)
    start = f"{prefix}/" if prefix else ""
    try:
        return [
            (o.key[len(start) :], int(o.size), str(o.e_tag).strip('"'), o.last_modified.timestamp())
            for o in _bucket(bucket).objects.filter(Prefix=start)
            if not o.key.endswith("/")
        ]
    except botocore.exceptions.NoCredentialsError:
        raise UserError(
            f"{where}: {url}: no S3 credentials; set SNAKEMAKE_STORAGE_S3_ACCESS_KEY and "
            "SNAKEMAKE_STORAGE_S3_SECRET_KEY (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY) "
            "in the environment"
        ) from None
    except botocore.exceptions.ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "?")
        raise UserError(
            f"{where}: {url}: S3 refused the listing ({code}); check the bucket name and that "
            "the credentials may list it"
        ) from None
    except botocore.exceptions.BotoCoreError as exc:
        raise UserError(
            f"{where}: {url}: S3 not reachable ({type(exc).__name__}); check "
            "SNAKEMAKE_STORAGE_S3_ENDPOINT_URL"
        ) from None


def entries(url: str, where: str) -> list[S3Entry]:
    """Every first-level "directory" and bare `.pt`/`.pth`/`.bin` object under `url`."""
    groups: dict[str, list[S3Object]] = {}
    bare: list[S3Entry] = []
    base = url.rstrip("/")
    for key, size, etag, modified in list_objects(url, where):
        head, sep, rest = key.partition("/")
        if head.startswith("."):
            continue
        if sep:
            groups.setdefault(head, []).append(S3Object(rest, size, etag, modified))
        elif key.endswith(BARE_SUFFIXES):
            name = key.rsplit(".", 1)[0]
            obj = S3Object("", size, etag, modified)  # the entry's URL is the object's
            bare.append(S3Entry(name, f"{base}/{key}", (obj,), bare=True))
    dirs = [
        S3Entry(n, f"{base}/{n}", tuple(sorted(o, key=lambda x: x.rel))) for n, o in groups.items()
    ]
    return sorted([*dirs, *bare], key=lambda e: e.name)


def waiting_for(entry: S3Entry, marker: str | None) -> str | None:
    """None when `entry` is completely uploaded, else what it still waits for ("shard 2 of 4
    not there yet", "no config.json"), from its keys alone."""
    if entry.bare:
        return None
    files = entry.files
    if marker:
        return None if marker in files else f"no {marker} yet (runs.<name>.complete_marker)"
    if any(ZERO_MODEL.match(rel) for rel in files):
        return _zero_waiting(files)
    ranks = [m for rel in files if (m := VERL_SHARD.match(rel))]
    if ranks or "actor/fsdp_config.json" in files:
        world = max((int(m.group(1)) for m in ranks), default=0)
        for rank in range(world):
            if f"actor/model_world_size_{world}_rank_{rank}.pt" not in files:
                return f"shard {rank + 1} of {world} not there yet"
        return None if "actor/fsdp_config.json" in files else "no actor/fsdp_config.json yet"
    if ".metadata" in files or any(r.endswith(".distcp") for r in files):
        return None if ".metadata" in files else "no .metadata yet"
    if "adapter_config.json" in files or "adapter_model.safetensors" in files:
        ok = "adapter_config.json" in files and "adapter_model.safetensors" in files
        return None if ok else "adapter_config.json or adapter_model.safetensors not there yet"
    return _hf_waiting(files)


def _hf_waiting(files: dict[str, S3Object]) -> str | None:
    shards = [m for rel in files if (m := OF_N_SHARD.match(rel))]
    if shards:
        stem, total, ext = shards[0].group(1), int(shards[0].group(3)), shards[0].group(4)
        for i in range(1, total + 1):
            if f"{stem}-{i:05d}-of-{total:05d}.{ext}" not in files:
                return f"shard {i} of {total} not there yet"
    elif any(r.endswith(".index.json") for r in files):
        return "index there, shards not there yet"
    elif "model.safetensors" not in files:
        torch_files = [r for r in files if r.endswith(BARE_SUFFIXES) and "/" not in r]
        return None if torch_files else "no model weights yet"
    return None if "config.json" in files else "no config.json yet"


def _zero_waiting(files: dict[str, S3Object]) -> str | None:
    """A DeepSpeed ZeRO checkpoint: optimizer states for ranks 0..R with no gap (and, at stage
    3, as many model states). The world size is inside the model states' pickle, so a missing
    last rank shows only when consolidation reads it (one line naming the file)."""
    ranks = sorted(int(m.group(1)) for rel in files if (m := ZERO_OPTIM.match(rel)))
    if not ranks:
        return "no *_optim_states.pt yet"
    for rank in range(max(ranks) + 1):
        if rank not in ranks:
            return f"shard {rank + 1} of {max(ranks) + 1} not there yet"
    stage3 = [rel for rel in files if ZERO_MODEL.match(rel) and rel.startswith("zero_pp_rank_")]
    if stage3 and len(stage3) != len(ranks):
        return f"{len(stage3)} of {len(ranks)} zero_pp_rank_*_model_states.pt there yet"
    return None
