"""Postroom: an AMQP 0-9-1 routing broker on Twisted.

The packages are layers; each imports only those below it (``import-linter`` checks this in
lint, with the contract in ``setup.cfg``):

* ``tools``: the command line, the dead-letter tools, test and fuzzing helpers;
* ``server``: the Twisted shell (listeners, the service, HTTP management and metrics,
  resource alarms, plugin loading);
* ``clients``: Postroom's own AMQP clients (blocking and Twisted), which need only ``wire``;
* ``amqp``: the sans-IO connection and channel state machines;
* ``storage``: spooling, paging, checkpoints and the log writer, on top of the model;
* ``core``: the broker model (vhosts, exchanges, queues, consumers);
* ``wal``: the log's record format and segment files;
* ``wire``: the AMQP 0-9-1 byte formats (frames, field tables, content properties).

``errors``, ``interfaces`` and ``text`` are the vocabulary every layer may use.
"""

__all__: list[str] = []
