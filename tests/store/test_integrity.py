"""Checksums, SSD atomicity across a crash, and an SSD that cannot be written."""

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from heterofold.kv import HEADER_SIZE, header_digest
from store.errors import PayloadCorrupt
from store.kv_store import KVStore
from store.payload import Payload
from store.redis_server import EmbeddedRedis
from store.ssd_tier import CHUNK, SsdTier

from .conftest import FP, assert_same, make_kv

TOKENS = list(range(300, 312))


def ssd_files(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "ssd").iterdir())


def test_payload_failing_its_checksum_is_removed_and_never_returned(
    open_store: Callable[..., KVStore], tmp_path: Path
) -> None:
    store = open_store(cpu_budget=0)
    scope = store.scope(FP, "t")
    handle = store.put(scope, make_kv(TOKENS)).handle_id
    path = tmp_path / "ssd" / f"{handle}.kv"
    blob = bytearray(path.read_bytes())
    blob[-3] ^= 0x40
    path.write_bytes(bytes(blob))

    match = store.lookup(scope, TOKENS)
    assert match is not None
    with pytest.raises(PayloadCorrupt):
        store.load(match)
    assert store.lookup(scope, TOKENS) is None
    assert not path.exists() and store.usage()[1].used == 0
    evicted = [e.fields for e in store.events.read(count=100) if e.kind == "kv.evicted"]
    assert evicted == [evicted[0]] and evicted[0]["reason"] == "corrupt"


def test_a_valid_file_of_another_value_is_refused_by_the_recorded_checksum(
    open_store: Callable[..., KVStore], tmp_path: Path
) -> None:
    store = open_store(cpu_budget=0)
    scope = store.scope(FP, "t")
    mine = store.put(scope, make_kv(TOKENS)).handle_id
    other = store.put(scope, make_kv([1, 2, 3, 4], seed=5)).handle_id
    shutil.copy(tmp_path / "ssd" / f"{other}.kv", tmp_path / "ssd" / f"{mine}.kv")
    match = store.lookup(scope, TOKENS)
    assert match is not None
    with pytest.raises(PayloadCorrupt):
        store.load(match)
    assert store.lookup(scope, TOKENS) is None


@pytest.mark.parametrize("fsync", [False, True])
def test_ssd_tier_writes_the_canonical_bytes_and_reads_them_back_verified(tmp_path: Path, fsync: bool) -> None:
    kv = make_kv(list(range(640)), H=4, D=256)  # 10.5 MB: read and hashed in several chunks
    tier = SsdTier(tmp_path, budget=1 << 30, fsync=fsync)
    stored = tier.put("h", Payload(kv))
    blob = tier.path("h").read_bytes()
    assert len(blob) > 2 * CHUNK and stored.nbytes == len(blob)
    assert blob == kv.to_bytes() and stored.checksum == header_digest(blob).hex()
    payload = tier.get("h", stored.checksum)
    assert_same(payload.kv, kv)
    assert payload.serialized and payload.checksum == stored.checksum


def flip(at: int) -> Callable[[bytes], bytes]:
    def damage(blob: bytes) -> bytes:
        out = bytearray(blob)
        out[at] ^= 0x10
        return bytes(out)

    return damage


@pytest.mark.parametrize(
    "damage",
    [
        flip(-1),  # the last chunk's last byte
        flip(CHUNK + 5),  # inside the second chunk
        flip(HEADER_SIZE + 20),  # the JSON header
        lambda blob: blob[: 2 * CHUNK],  # truncated at a chunk boundary
        lambda blob: blob[:-1],
        lambda blob: blob[:HEADER_SIZE],  # the header alone
        lambda blob: b"",
        lambda blob: b"HFKX" + blob[4:],  # another magic
        lambda blob: blob[:4] + (1).to_bytes(2, "little") + blob[6:],  # format version 1
        lambda blob: blob + b"\0",  # grown
    ],
    ids=["last", "chunk2", "json", "truncated-chunk", "truncated", "header-only", "empty", "magic", "v1", "grown"],
)
def test_ssd_tier_drops_a_damaged_file_and_never_returns_it(tmp_path: Path, damage: Callable[[bytes], bytes]) -> None:
    tier = SsdTier(tmp_path, budget=1 << 30)
    checksum = tier.put("h", Payload(make_kv(list(range(640)), H=4, D=256))).checksum
    path = tier.path("h")
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(PayloadCorrupt):
        tier.get("h", checksum)
    assert "h" not in tier and not path.exists()


@pytest.fixture
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    """A redis-server of this test's own, outliving the store processes that crash against it."""
    with EmbeddedRedis(tmp_path_factory.mktemp("redis")) as s:
        yield s


def crash_during_put(data_dir: Path, url: str, patch: str) -> int:
    """Run a put in another process, with ``patch`` making it die mid-way (``os._exit``)."""
    code = textwrap.dedent(f"""
        import os, torch
        import store.index, store.ssd_tier
        from heterofold.kv import KVCache
        from store.config import StoreConfig
        from store.kv_store import KVStore
        {patch}
        s = KVStore(StoreConfig(data_dir={str(data_dir)!r}, redis_url={url!r}, page_size=4, cpu_budget=0))
        kv = KVCache({FP!r}, torch.tensor({TOKENS!r}), torch.arange({len(TOKENS)}),
                     (torch.ones(1, {len(TOKENS)}, 2),), (torch.ones(1, {len(TOKENS)}, 2),), (0,))
        s.put(s.scope({FP!r}, "t"), kv)
        os._exit(0)
    """)
    return subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2], timeout=60).returncode


def test_crash_between_write_and_rename_leaves_no_visible_handle(
    open_store: Callable[..., KVStore], server: EmbeddedRedis, tmp_path: Path
) -> None:
    rc = crash_during_put(tmp_path, server.url, "store.ssd_tier.os.replace = lambda *a: os._exit(3)")
    assert rc == 3
    assert [n for n in ssd_files(tmp_path) if n.endswith(".tmp")]  # the half-done write is there
    store = open_store(redis_url=server.url)
    assert store.lookup(store.scope(FP, "t"), TOKENS) is None
    assert ssd_files(tmp_path) == []  # and gone once a store starts
    assert store.put(store.scope(FP, "t"), make_kv(TOKENS)).outcome == "stored"


def test_crash_after_rename_before_indexing_leaves_no_visible_handle(
    open_store: Callable[..., KVStore], server: EmbeddedRedis, tmp_path: Path
) -> None:
    rc = crash_during_put(tmp_path, server.url, "store.index.Index.register = lambda *a, **k: os._exit(4)")
    assert rc == 4
    assert len(ssd_files(tmp_path)) == 1  # a complete file that no handle names
    store = open_store(redis_url=server.url)
    assert store.lookup(store.scope(FP, "t"), TOKENS) is None
    assert ssd_files(tmp_path) == [] and store.usage()[1].used == 0


def test_unwritable_ssd_is_skipped_with_an_alert(open_store: Callable[..., KVStore], tmp_path: Path) -> None:
    store = open_store(cpu_budget=1800)  # room for one value in memory
    scope = store.scope(FP, "t")
    shutil.rmtree(tmp_path / "ssd")
    (tmp_path / "ssd").write_text("not a directory")  # every write under it fails, even as root

    assert store.put(scope, make_kv(TOKENS)).tier == "cpu"
    second = store.put(scope, make_kv([9, *TOKENS[1:]], seed=1))
    assert second.tier == "cpu"  # the first could not be demoted to SSD, so it was evicted
    assert store.lookup(scope, TOKENS) is None
    assert store.put(scope, make_kv(list(range(40)), seed=2)).outcome == "skipped"  # fits nowhere
    reasons = [(e.fields["reason"], e.fields["tier"]) for e in store.events.read(count=100) if e.kind == "oom.alert"]
    assert ("tier_unavailable", "ssd") in reasons and ("no_space", "cpu,ssd") in reasons


def test_store_opens_without_its_ssd_tier_when_the_directory_is_unusable(
    open_store: Callable[..., KVStore], tmp_path: Path
) -> None:
    (tmp_path / "ssd").write_text("not a directory")
    store = open_store()
    assert [u.tier for u in store.usage()] == ["cpu"]
    assert store.put(store.scope(FP, "t"), make_kv(TOKENS)).tier == "cpu"
    alerts = [e.fields for e in store.events.read(count=100) if e.kind == "oom.alert"]
    assert alerts[0]["reason"] == "tier_unavailable" and alerts[0]["tier"] == "ssd"


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs mounted as the SSD directory, to fill a real disk."""
    ssd = tmp_path / "ssd"
    ssd.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(ssd)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield ssd
    finally:
        subprocess.run(["umount", str(ssd)], check=True)


def test_full_disk_is_skipped_with_an_alert_and_leaves_no_partial_file(
    open_store: Callable[..., KVStore], tiny_disk: Path
) -> None:
    store = open_store(cpu_budget=0, ssd_budget=1 << 20)  # the budget allows more than the disk holds
    scope = store.scope(FP, "t")
    results = [store.put(scope, make_kv([i, *list(range(63))], seed=i)).outcome for i in range(12)]
    assert "stored" in results and results[-1] == "skipped"
    assert not [n for n in os.listdir(tiny_disk) if n.endswith(".tmp")]
    assert store.usage()[1].used == sum(p.stat().st_size for p in tiny_disk.iterdir())
    assert any(e.fields["reason"] == "tier_unavailable" for e in store.events.read(count=200) if e.kind == "oom.alert")
