#!/usr/bin/python3
"""bench/delay_proxy.py -- a TCP proxy that delays every byte by DELAY_MS in
each direction, to measure what round trips cost at a network distance.

    delay_proxy.py LISTEN_PORT TARGET_HOST TARGET_PORT DELAY_MS

Each chunk read from one side is written to the other DELAY_MS after it was
read, in order (a fixed one-way latency, no bandwidth limit), so a request
and its answer take 2 x DELAY_MS more per round trip.  Prints "ready" once
listening; runs until killed.
"""
import asyncio
import socket
import sys


async def pump(reader, writer, delay):
    loop = asyncio.get_running_loop()
    queue = asyncio.Queue()

    async def sender():
        while True:
            due, data = await queue.get()
            if data is None:
                break
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        writer.close()

    task = asyncio.create_task(sender())
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            queue.put_nowait((loop.time() + delay, data))
    except (ConnectionError, OSError):
        pass
    queue.put_nowait((loop.time() + delay, None))
    try:
        await task
    except (ConnectionError, OSError):
        pass


def nodelay(writer):
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


async def main():
    listen_port, host, port, delay_ms = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    delay = delay_ms / 1000.0

    async def handle(creader, cwriter):
        try:
            sreader, swriter = await asyncio.open_connection(host, port)
        except OSError:
            cwriter.close()
            return
        nodelay(cwriter)
        nodelay(swriter)
        await asyncio.gather(pump(creader, swriter, delay), pump(sreader, cwriter, delay))

    server = await asyncio.start_server(handle, "127.0.0.1", listen_port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
