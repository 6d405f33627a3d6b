"""Adapter: a pod's container runtime log writer. `python -m fsdpctl.adapters.logrelay LOG ERR_FD`
reads the pod's stdout (its stdin) and stderr (fd ERR_FD) from pipes and appends each line to LOG in
the CRI log format (fsdpctl.job.crilog), stamped when it was read, as containerd's CRI plugin does
for a container (pkg/cri/io/logger.go, redirectLogs). It is a process of its own, like
containerd-shim or conmon: the pod's output keeps flowing to its log if the supervisor dies, and it
ends when every writer of the pipes is gone.
"""

from __future__ import annotations

import os
import selectors
import sys
import time

from fsdpctl import files
from fsdpctl.job import crilog


def relay(log: str, fds: dict[int, str]) -> None:
    """Until both pipes are closed: each whole line written at once (O_APPEND), so readers never see
    half of one unless this process is killed mid-write; a line longer than crilog.MAX_LINE goes out
    in P pieces; a CR LF ending is dropped like a LF one (containerd's readLine); what is left at
    the end without a newline is written as a P piece, as redirectLogs does at EOF (readers show it
    whole once no more can come)."""
    out = files.open_append(log, 0o644)  # a link or FIFO at the log: refused, never followed
    sel = selectors.DefaultSelector()
    pending = dict.fromkeys(fds, b"")
    for fd in fds:
        sel.register(fd, selectors.EVENT_READ)

    def write(fd: int, data: bytes, tag: str) -> None:
        """One line, or a line longer than crilog.MAX_LINE as P pieces (containerd: maxLen) then the
        rest."""
        now = time.time()
        while len(data) > crilog.MAX_LINE:
            piece, data = data[: crilog.MAX_LINE], data[crilog.MAX_LINE :]
            os.write(out, crilog.format_bytes(now, fds[fd], piece, crilog.PARTIAL))
        os.write(out, crilog.format_bytes(now, fds[fd], data, tag))

    while sel.get_map():
        for key, _ in sel.select():
            fd = key.fd
            chunk = os.read(fd, 65536)
            if not chunk:
                sel.unregister(fd)
                if pending[fd]:
                    write(fd, pending[fd], crilog.PARTIAL)
                continue
            buf = pending[fd] + chunk
            *whole, buf = buf.split(b"\n")
            for line in whole:
                write(fd, line.removesuffix(b"\r"), crilog.FULL)
            while (
                len(buf) >= crilog.MAX_LINE
            ):  # that long without a newline: a piece out, as containerd does
                write(fd, buf[: crilog.MAX_LINE], crilog.PARTIAL)
                buf = buf[crilog.MAX_LINE :]
            pending[fd] = buf
    os.close(out)


if __name__ == "__main__":
    relay(sys.argv[1], {0: "stdout", int(sys.argv[2]): "stderr"})
