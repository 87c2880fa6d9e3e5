"""The Python `rabbitkit` package (PyPI) on the success and failure workloads.

success: the handler returns; rabbitkit acks.
failure: the handler raises TimeoutError (transient for rabbitkit's default classifier);
`RetryConfig(max_retries=1, delays=(3600,))` makes its RetryMiddleware publish the retry
envelope, mandatory and confirmed, to `<queue>.retry.1` (a classic TTL queue, its default)
and ack the original after the confirm. The 1 h delay keeps copies out of the run.

    python rabbitkit_peer.py declare --url URL --queue Q --path failure
    python rabbitkit_peer.py run --url URL --queue Q --path failure -n 20000
"""

from __future__ import annotations

import asyncio

from peer_common import Meter, emit, parse_args, quiet, url_parts
from rabbitkit import AsyncBroker, ConnectionConfig, RabbitConfig, RetryConfig


def build(args, meter: Meter | None) -> AsyncBroker:
    fail = args.path == "failure"
    retry = RetryConfig(max_retries=1, delays=(3600,)) if fail else None
    broker = AsyncBroker(RabbitConfig(connection=ConnectionConfig(**url_parts(args.url)), retry=retry))

    @broker.subscriber(queue=args.queue, prefetch_count=args.prefetch, retry=retry)
    async def handle(body: bytes) -> None:
        if meter is not None:
            meter.first()
        if fail:
            raise TimeoutError("bench failure")

    return broker


async def main() -> None:
    args = parse_args()
    quiet()
    if args.command == "declare":
        broker = build(args, None)
        await broker.start()
        await broker.stop()
        copies = f"{args.queue}.retry.1" if args.path == "failure" else None
        emit("PEER_QUEUES", {"work": args.queue, "copies": copies})
        return
    meter = Meter(args.n)
    broker = build(args, meter)
    await broker.start()
    try:
        await meter.wait(args.timeout)
    finally:
        await broker.stop()
    emit("PEER_RESULT", meter.result())


if __name__ == "__main__":
    asyncio.run(main())
