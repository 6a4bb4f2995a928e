"""Adapter artifacts on disk: where fitted and uploaded versions live, and how an upload is taken in.

Uploads never use a client-supplied name or path: the two files are streamed into a fresh folder
with the artifact's fixed file names under ``adapters_dir``, capped in size, verified by
``Adapter.load`` (weights sha256 against the manifest, shapes), and only then moved into place
under a generated name.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import BinaryIO

from gateway.errors import InvalidRequest, PayloadTooLarge
from heterofold.adapter import MANIFEST, WEIGHTS, Adapter
from heterofold.errors import AdapterError

CHUNK = 1 << 20


def new_folder(adapters_dir: Path, sender: str, receiver: str) -> Path:
    """A fresh folder for one version: ``<adapters_dir>/<sender>__<receiver>/<uuid>``."""
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in f"{sender}__{receiver}")
    return adapters_dir / safe / uuid.uuid4().hex


def _copy_capped(src: BinaryIO, dst: Path, limit: int) -> int:
    total = 0
    with dst.open("wb") as out:
        while chunk := src.read(CHUNK):
            total += len(chunk)
            if total > limit:
                raise PayloadTooLarge(f"an artifact file is over {limit} bytes")
            out.write(chunk)
    return total


def take_upload(adapters_dir: Path, manifest: BinaryIO, weights: BinaryIO, limit: int) -> tuple[Adapter, Path, str]:
    """Verify an uploaded artifact and move it into place; returns the adapter, its folder and the
    weights' sha256. Raises InvalidRequest for anything that is not a valid artifact."""
    staging = adapters_dir / ".uploads" / uuid.uuid4().hex
    staging.mkdir(parents=True)
    try:
        _copy_capped(manifest, staging / MANIFEST, 1 << 20)
        _copy_capped(weights, staging / WEIGHTS, limit)
        try:
            data = json.loads((staging / MANIFEST).read_text())
            sender, receiver = data["sender"], data["receiver"]
            adapter = Adapter.load(staging, sender_fingerprint=sender["fingerprint"],
                                   receiver_fingerprint=receiver["fingerprint"])  # fmt: skip
        except (AdapterError, KeyError, TypeError, ValueError, UnicodeDecodeError) as exc:
            raise InvalidRequest(f"not a valid adapter artifact: {exc}", code="invalid_adapter") from exc
        folder = new_folder(adapters_dir, adapter.manifest.sender.name, adapter.manifest.receiver.name)
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(folder)
        return adapter, folder, str(data["weights_sha256"])
    finally:
        shutil.rmtree(staging, ignore_errors=True)
