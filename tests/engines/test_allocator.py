"""The allocator settings (engines/allocator.py): freed KV-sized tensors are reused, not faulted in
again. Counted in minor page faults of a fresh process, not in time."""

import os
import platform
import subprocess
import sys

import pytest

SCRIPT = """
import resource, torch
from engines.allocator import tune_allocator
tuned = tune_allocator()
x = torch.randn(1, 4323, 256)  # one KV layer of gemma3 at 4K tokens, 4.4 MB
def clones():
    ys = [x.clone() for _ in range(36)]
    del ys
clones(); clones()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
clones()
print(tuned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc malloc settings only"
)


def _run(malloc: str) -> tuple[bool, int]:
    env = {**os.environ, "HETEROFOLD_MALLOC": malloc}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    tuned, faults = out.stdout.split()
    return tuned == "True", int(faults)


def test_tuned_allocator_reuses_freed_tensors_instead_of_faulting_them_in() -> None:
    tuned, tuned_faults = _run("tuned")
    system, _ = _run("system")
    assert tuned and not system
    # A round faults in 36 x 1080 pages when every tensor is fresh memory, as glibc's defaults give
    # in some runs (its adaptive threshold makes other runs reuse memory: no bound on that side).
    assert tuned_faults < 36 * 1080 / 5


def test_an_engine_applies_the_settings(load_engine) -> None:  # type: ignore[no-untyped-def]
    from engines import allocator

    load_engine("smollm2-135m-instruct")
    assert allocator._tuned is (os.environ.get("HETEROFOLD_MALLOC") != "system")
