"""FastStream (PyPI) on the success and failure workloads.

success: the handler returns; FastStream acks.
failure: FastStream has no confirmed retry of its own (its ack policies reject to a
dead-letter exchange without a confirm, or requeue in a hot loop), so a consume middleware
of ~15 lines does what users write: on a handler error it republishes the body and headers
(plus one attempt header), mandatory and persistent, to `<queue>.copies` through
`broker.publish()` (whose default channel has confirms on), checks that the broker answered
Basic.Ack (a returned mandatory message resolves to something else), and returns, so
FastStream acks the original. Per-message logging off (`logger=None`).

    python faststream_peer.py declare --url URL --queue Q --path failure
    python faststream_peer.py run --url URL --queue Q --path failure -n 20000
"""

from __future__ import annotations

import asyncio

from faststream import BaseMiddleware
from faststream.rabbit import RabbitBroker, RabbitQueue
from faststream.rabbit.schemas import Channel
from pamqp.commands import Basic

from peer_common import Meter, emit, parse_args, quiet


def build(args, meter: Meter | None) -> tuple[RabbitBroker, str]:
    copies = f"{args.queue}.copies"
    holder: dict = {}

    class Republish(BaseMiddleware):
        async def consume_scope(self, call_next, msg):
            try:
                return await call_next(msg)
            except Exception:
                raw = msg.raw_message
                headers = dict(raw.headers or {})
                headers["x-bench-attempt"] = 2
                confirm = await holder["broker"].publish(
                    raw.body,
                    queue=copies,
                    mandatory=True,
                    persist=True,
                    headers=headers,
                    message_id=raw.message_id,
                    correlation_id=raw.correlation_id,
                    content_type=raw.content_type,
                )
                if not isinstance(confirm, Basic.Ack):
                    raise RuntimeError(f"copy not confirmed: {confirm!r}") from None
                return None

    fail = args.path == "failure"
    broker = RabbitBroker(args.url, logger=None, middlewares=[Republish] if fail else [])
    holder["broker"] = broker

    @broker.subscriber(
        RabbitQueue(args.queue, durable=True),
        channel=Channel(prefetch_count=args.prefetch),
    )
    async def handle(body: bytes) -> None:
        if meter is not None:
            meter.first()
        if fail:
            raise TimeoutError("bench failure")

    return broker, copies


async def main() -> None:
    args = parse_args()
    quiet()
    if args.command == "declare":
        broker, copies = build(args, None)
        await broker.start()
        if args.path == "failure":
            await broker.declare_queue(RabbitQueue(copies, durable=True))
        await broker.stop()
        emit("PEER_QUEUES", {"work": args.queue, "copies": copies if args.path == "failure" else None})
        return
    meter = Meter(args.n)
    broker, _ = build(args, meter)
    await broker.start()
    try:
        await meter.wait(args.timeout)
    finally:
        await broker.stop()
    emit("PEER_RESULT", meter.result())


if __name__ == "__main__":
    asyncio.run(main())
