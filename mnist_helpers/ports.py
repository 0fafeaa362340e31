"""TCP ports for rendezvous: a free one, who holds one, holding one on purpose (introduced in 07; 08 and the
doctor use it).

``free_port()`` asks the OS for a port that is free now (for ``--rdzv-endpoint`` or ``MASTER_PORT``);
``port_is_free(port)`` tries to bind it; ``find_port_holders(port)`` is ``lsof -i :PORT`` through psutil;
``hold_port(port)`` starts a separate process that listens on a port, like a previous run that never exited.
"""
from __future__ import annotations

import contextlib
import socket
import subprocess
import sys


def free_port() -> int:
    """A TCP port that is free right now (the OS picks it), e.g. for a multi-node ``rdzv_endpoint``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def find_port_holders(port: int) -> list[dict]:
    """Who listens on TCP ``port`` (the ``lsof -i :PORT`` of psutil): pid, name, command line."""
    import psutil

    holders = []
    for conn in psutil.net_connections(kind="tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
            info = {"pid": conn.pid, "address": f"{conn.laddr.ip}:{conn.laddr.port}", "name": None, "cmdline": None}
            if conn.pid:
                with contextlib.suppress(psutil.Error):
                    p = psutil.Process(conn.pid)
                    info["name"], info["cmdline"] = p.name(), " ".join(p.cmdline()).replace("\n", " ")[:160]
            holders.append(info)
    return holders


@contextlib.contextmanager
def hold_port(port: int | None = None):
    """A separate process listening on ``port`` (like a previous run that never exited); yields (port, process)."""
    port = port or free_port()
    code = ("import socket, time; s = socket.socket(); s.bind(('', %d)); s.listen(); "
            "print('listening', flush=True); time.sleep(600)" % port)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        if proc.stdout.readline().strip() != "listening":
            raise RuntimeError(f"could not hold port {port} (already taken?)")
        yield port, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
