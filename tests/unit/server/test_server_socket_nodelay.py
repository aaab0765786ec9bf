"""The server's listening socket makes asyncio (uvicorn's loop) set TCP_NODELAY on every
accepted connection (issue 15): with a proto of 0 it did not, and each answer on a kept-alive
connection after the first waited ~40 ms for the client's delayed ACK. Real sockets on
loopback, a real asyncio server on the socket, as uvicorn serves it."""

from __future__ import annotations

import asyncio
import socket

import pytest

from trainyard.server.__main__ import listening_socket


async def _nodelay_of_accepted(sock: socket.socket) -> int:
    seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted = writer.get_extra_info("socket")
        seen.set_result(accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
        writer.close()

    server = await asyncio.start_server(handle, sock=sock)
    async with server:
        port = sock.getsockname()[1]
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        value = await asyncio.wait_for(seen, timeout=30)
        writer.close()
    return value


def test_connections_accepted_on_the_servers_socket_have_tcp_nodelay() -> None:
    sock = listening_socket("127.0.0.1", 0)
    assert sock.getsockname()[1] != 0 and sock.proto == socket.IPPROTO_TCP
    assert asyncio.run(_nodelay_of_accepted(sock)) != 0


def test_a_socket_with_proto_0_would_not_get_it() -> None:
    """The cause, kept as a check that the test above can fail: asyncio skips proto 0."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    if asyncio.run(_nodelay_of_accepted(sock)) != 0:
        pytest.skip(
            "this Python's asyncio sets TCP_NODELAY whatever the proto: the fix is "
            "then not needed, and the test above cannot fail here"
        )
