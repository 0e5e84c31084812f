#!/usr/bin/python3
"""Run a command with its stdout and stderr on a pseudo-terminal; write what it printed there.

    tests/python/on_terminal.py PROGRAM [ARGS...]

For tests of output meant for a terminal (runner generate escapes what would garble one). The
terminal's newline translation is undone (CR LF -> LF). Exits with the command's exit code.
"""
import os
import pty
import sys

pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
out = b""
while True:
    try:
        chunk = os.read(fd, 4096)
    except OSError:  # EIO: the child closed the terminal
        break
    if not chunk:
        break
    out += chunk
_, status = os.waitpid(pid, 0)
sys.stdout.buffer.write(out.replace(b"\r\n", b"\n"))
sys.exit(os.waitstatus_to_exitcode(status))
