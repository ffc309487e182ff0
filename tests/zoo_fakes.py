"""The zoo runner against stand-in architectures that hang, crash, eat memory and spin, in a
process of its own (tests/test_zoo.py runs it: the runner forks, and a test must not fork the
pytest process). Prints the number of progress lines last."""
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from doctor_lab.zoo import runner, worker  # noqa: E402


def fake_examine(arch, impl, table, checks):
    """Stands in for worker.examine_one inside the forked workers (they inherit the patch)."""
    if arch == "hang":
        time.sleep(600)
    if arch == "segv":
        os.kill(os.getpid(), 11)
    if arch == "hog":
        bytearray(8 << 30)  # past the address-space cap: MemoryError
    if arch == "spin":
        while True:
            pass
    return {"arch": arch, "impl": impl, "status": "examined", "checks": []}


def vm_size() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def main(out: Path) -> None:
    worker.examine_one = fake_examine
    archs = ["hang", "segv", "hog", "ok"]
    hashes = dict.fromkeys(archs + ["spin"], "h")
    tasks = runner.pending(archs, ["eager", "sdpa"], out, hashes)
    assert tasks == {a: ["eager", "sdpa"] for a in archs}, tasks
    seen = []
    runner.run(tasks, out, checks=None, table={"archs": {}}, hashes=hashes, workers=2,
               timeout_s=3, cpu_s=60, mem_bytes=vm_size() + (1 << 30), progress=seen.append)
    # a busy loop meets the CPU cap (SIGXCPU) long before the wall clock, even on a loaded box
    runner.run({"spin": ["eager"]}, out, checks=None, table={"archs": {}}, hashes=hashes,
               timeout_s=300, cpu_s=1, mem_bytes=None, progress=seen.append)
    print(len(seen))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
