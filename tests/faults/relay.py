"""A TCP relay that adds a fixed one-way delay to every chunk, both directions (netem does not exist in this
kernel; findings.md section 4). Stdlib only; run it inside the device's network namespace:

    python relay.py LISTEN_HOST LISTEN_PORT TARGET_HOST TARGET_PORT DELAY_S

Each direction is a reader that timestamps chunks and a writer that sends each one ``DELAY_S`` after it arrived,
so the link keeps its bandwidth and gains ``2 * DELAY_S`` of round trip. Prints ``ready`` once listening.
"""

from __future__ import annotations

import asyncio
import sys


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
    loop = asyncio.get_running_loop()

    async def read() -> None:
        while True:
            data = await reader.read(1 << 16)
            await queue.put((loop.time() + delay, data))
            if not data:
                return

    async def write() -> None:
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                try:
                    writer.write_eof()
                except OSError:
                    pass
                return
            writer.write(data)
            await writer.drain()

    try:
        await asyncio.gather(read(), write())
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()


async def _main(listen_host: str, listen_port: int, target_host: str, target_port: int, delay: float) -> None:
    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(target_host, target_port)
        except OSError:
            client_w.close()
            return
        await asyncio.gather(_pump(client_r, server_w, delay), _pump(server_r, client_w, delay))

    server = await asyncio.start_server(handle, listen_host, listen_port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    host, port, thost, tport, delay_s = sys.argv[1:6]
    asyncio.run(_main(host, int(port), thost, int(tport), float(delay_s)))
