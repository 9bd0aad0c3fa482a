"""What passes between the warm server (server.py) and its clients (client.py), in one
module: the client's command line (torchrun runs it in place of `python -u`), its request
(a length-prefixed JSON object with argv, environment and working directory, stdin,
stdout and stderr passed as file descriptors) and the server's two answers (one JSON line
each: the child's pid, then its wait status). Standard library only: the client
imports this at every attempt."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from elastic_worker import bundle

SERVER_MODULE = "elastic_worker.warm.server"
CLIENT_MODULE = "elastic_worker.warm.client"
HEADER = struct.Struct("!I")
#: A request larger than this is refused (an environment is a few kilobytes).
MAX_REQUEST = 1 << 22


def warm_command(program: Sequence[str], python: str, socket_path: str) -> list[str] | None:
    """The client's argv standing in for `program` (launch.program_argv's output), or None
    when it is not `PY -u script ...` / `PY -u -m module ...` run by this interpreter."""
    if len(program) < 3 or program[0] != python or program[1] != "-u":
        return None
    if program[2] == "-m" and len(program) < 4:
        return None
    if program[2].startswith("-") and program[2] != "-m":
        return None
    return [*bundle.module_argv(python, CLIENT_MODULE, bundle.WARM), socket_path, *program[1:]]


@dataclass
class Request:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    fds: list[int] = field(default_factory=list)


def recv_request(conn: socket.socket) -> Request:
    conn.settimeout(10)
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    if len(data) < HEADER.size:
        raise ValueError("short request")
    (size,) = HEADER.unpack_from(data)
    if size > MAX_REQUEST:
        raise ValueError(f"request of {size} bytes")
    body = data[HEADER.size :]
    while len(body) < size:
        chunk = conn.recv(size - len(body))
        if not chunk:
            raise ValueError("truncated request")
        body += chunk
    conn.settimeout(None)
    fields = json.loads(body)
    return Request(list(fields["argv"]), dict(fields["env"]), str(fields["cwd"]), list(fds))


def send_request(
    conn: socket.socket, argv: Sequence[str], env: Mapping[str, str], cwd: str
) -> None:
    """The client's request, with its stdin, stdout and stderr."""
    payload = json.dumps({"argv": list(argv), "env": dict(env), "cwd": cwd}).encode()
    socket.send_fds(conn, [HEADER.pack(len(payload)) + payload], [0, 1, 2])


def send(conn: socket.socket, **fields: int) -> None:
    with contextlib.suppress(OSError):  # the client is gone: its EOF kills the child
        conn.sendall(json.dumps(fields).encode() + b"\n")


def read_reply(conn: socket.socket) -> dict[str, int] | None:
    """One answer line of the server's; None when it closed first."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
    reply: dict[str, int] = json.loads(data)
    return reply
