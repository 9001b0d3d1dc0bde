"""Run a command with its stderr on a pseudo-terminal, as a user's shell would (tqdm draws)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time


def run_on_a_terminal(argv: list[str], timeout_s: float) -> tuple[int, str, str]:
    """Run ``argv`` with stderr on a pseudo-terminal (200 columns, so tqdm draws its bar);
    return ``(exit_code, stdout, terminal_output)``."""
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 200, 0, 0))
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=secondary
    )
    os.close(secondary)
    terminal = bytearray()
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], deadline - time.monotonic())
            if not ready:
                break
            try:
                data = os.read(primary, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            terminal += data
        stdout, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(primary)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, stdout.decode(), terminal.decode(errors="replace")
