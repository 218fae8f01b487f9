"""The AMQP 0-9-1 wire format: frames, field tables and content properties, as bytes.

Pure byte handling (pamqp and ``struct``): no broker state, no Twisted. The model below the
protocol reads messages through it, and the clients write through it.
"""

__all__: list[str] = []
