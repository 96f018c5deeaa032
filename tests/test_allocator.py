"""keep_freed_memory: freed tensor memory stays in the process (no page faults per new tensor)."""
import subprocess
import sys

import pytest

PROBE = """
import resource, sys, torch
if sys.argv[1] == "keep":
    from fedsweep.util.allocator import keep_freed_memory
    assert keep_freed_memory()
x = torch.ones(10, 30_010)

def step():   # what a local step does: a few new (K, n) tensors alive at once, then all freed
    held = [x * 1.0001 for _ in range(4)]
    del held

step()        # the first allocations fault in any case
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(50):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_tensors_are_reused_without_page_faults():
    # As glibc sets it, every 1.2 MB tensor comes back as fresh pages (~300 faults each); kept, none.
    default, kept = _faults("default"), _faults("keep")
    # a step makes 4 tensors of 293 pages: as glibc sets it, more than one tensor's worth of pages
    # faults in again every step (30,000-57,000 in 50 steps measured); kept, a few dozen a step (~1,000)
    assert default > 50 * 300
    assert kept < 50 * 60
