"""Read an offline W&B run back (`<run dir>/wandb/offline-run-*/run-*.wandb`), for tests.

wandb has no public reader for these files. The format: a 7-byte header (`:W&B`, a 2-byte magic,
a version byte), then LevelDB-style log records in 32 KiB blocks, each record a 7-byte header
(crc32 4, length 2 little-endian, type 1: full, first, middle, last) and a chunk of one
protobuf `wandb_internal_pb2.Record`; a block's tail shorter than a header is zero padding.
Call `wandb.teardown()` after `run.finish()` before reading: finish can return before the file
is complete.
"""
import json
import struct
from pathlib import Path

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path):
    """Every Record of one .wandb file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B file"
    pos, chunks = HEADER, []
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # zero padding to the block's end
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0:
            break  # preallocated zeros: the end of what was written
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, FIRST):
            chunks = [chunk]
        else:
            chunks.append(chunk)
        if kind in (FULL, LAST):
            r = pb.Record()
            r.ParseFromString(b"".join(chunks))
            yield r


def _key(item) -> str:
    return "/".join(item.nested_key) if item.nested_key else item.key


def read_run(run_dir) -> dict:
    """{name, group, tags, summary, history, exit_code} of the one W&B run under run_dir/wandb/."""
    files = sorted(Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"))
    assert len(files) == 1, f"{run_dir}: {len(files)} W&B runs, expected 1"
    out = {"name": None, "group": None, "tags": [], "summary": {}, "history": [], "exit_code": None,
           "file": files[0]}
    for r in records(files[0]):
        which = r.WhichOneof("record_type")
        if which == "run":
            out.update(name=r.run.display_name, group=r.run.run_group, tags=list(r.run.tags))
        elif which == "summary":
            for item in r.summary.update:
                out["summary"][_key(item)] = json.loads(item.value_json)
            for item in r.summary.remove:
                out["summary"].pop(_key(item), None)
        elif which == "history":
            out["history"].append({_key(i): json.loads(i.value_json) for i in r.history.item})
        elif which == "exit":
            out["exit_code"] = r.exit.exit_code
    return out
