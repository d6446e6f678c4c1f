"""User-facing errors: the binaries print them as one line and exit non-zero."""

import signal


class UserError(Exception):
    """Bad input the user can fix: the message says what is wrong and what to do."""


class Interrupted(Exception):
    """A training run stopped on request after checkpointing ``step``; ``signum`` is the
    signal that asked (SIGINT: Ctrl-C, or SIGTERM), which ``cli.stop_on_signals`` sets."""

    def __init__(self, step: int, signum: int = signal.SIGINT):
        super().__init__(f"stopped at step {step}, checkpoint saved")
        self.step = step
        self.signum = signum
