"""run.log: what a run prints, on stdout and stderr (the progress bar aside), is also written to
its run dir's run.log, from the command that started it to its verdict line or its traceback.
(Hydra's file handler appends there too, for anything logged through `logging`.)"""
import sys
from contextlib import contextmanager
from pathlib import Path


class _Tee:
    """A text stream that also writes to the log; the progress bar, which redraws itself in place
    (carriage returns), stays on the terminal."""

    def __init__(self, stream, log):
        self.stream, self.log = stream, log

    def write(self, s: str) -> int:
        if "\r" not in s:
            self.log.write(s)
        return self.stream.write(s)

    def flush(self):
        self.log.flush()
        self.stream.flush()

    def __getattr__(self, name):  # isatty, fileno, encoding: the terminal's
        return getattr(self.stream, name)


@contextmanager
def job_log(path: Path, command: str):
    """While the block runs, stdout and stderr are also appended to `path`, after `command`."""
    with open(path, "a", buffering=1, encoding="utf-8") as log:
        log.write(f"$ {command}\n")
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(out, log), _Tee(err, log)
        try:
            yield
        finally:
            sys.stdout, sys.stderr = out, err
