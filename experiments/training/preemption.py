"""Preemption: SIGTERM (a cluster or a user stopping the job) and submitit's timeout signal ask
the loop to stop at the next step boundary, where the state is consistent; the trainer then
writes a checkpoint and raises Preempted (or hands over to submitit's handler, which requeues)."""
import os
import signal
import threading


class Preempted(Exception):
    """A stop signal arrived: a checkpoint was written, the job should exit and be requeued."""


def preempt_signals() -> list[int]:
    """SIGTERM and submitit's preemption/timeout signal (USR2 unless SUBMITIT_PREEMPT_SIGNAL says otherwise)."""
    usr = getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), signal.SIGUSR2)
    return list(dict.fromkeys([signal.SIGTERM, usr]))


class StopSignals:
    """While installed (a `with` block on the main thread), a stop signal sets `.signum`."""

    def __init__(self):
        self.signum = 0
        self.old: dict = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, self._on_signal) for s in preempt_signals()}
        return self

    def _on_signal(self, signum, frame):
        self.signum = signum

    def restore(self):
        for s, h in self.old.items():
            signal.signal(s, h)
        self.old = {}

    def __exit__(self, *exc):
        self.restore()

    def stop(self, step: int, save_checkpoint, where) -> None:
        """Checkpoint, then exit: submitit's own handler (if it installed one for this signal)
        requeues the job, whose rerun resumes; otherwise Preempted ends the run."""
        save_checkpoint()
        signum, old = self.signum, self.old.get(self.signum)
        self.restore()
        if signum != signal.SIGTERM and callable(old):
            old(signum, None)  # submitit: dumps the requeue pickle and exits
        raise Preempted(f"signal {signal.Signals(signum).name} at step {step}; checkpoint written to {where}")
