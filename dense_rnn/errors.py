"""User-facing errors: the binaries print them as one line and exit non-zero."""


class UserError(Exception):
    """Bad input the user can fix: the message says what is wrong and what to do."""


class Interrupted(Exception):
    """A training run stopped on request (Ctrl-C, SIGTERM) after checkpointing ``step``."""

    def __init__(self, step: int):
        super().__init__(f"stopped at step {step}, checkpoint saved")
        self.step = step
