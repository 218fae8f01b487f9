"""The ``postroom`` subcommands, grouped by job; ``broker.tools.cli`` parses the command line
and runs them. Each takes the parsed arguments and returns the exit status.

* ``serving``: run the broker, check a configuration, list plugins, check and dump the log;
* ``messaging``: publish, consume and declare over AMQP;
* ``administration``: queues, policies, streams and definitions, through the management API;
* ``deadletters``: inspect and redrive a dead-letter queue, export and analyse dead letters.
"""

__all__: list[str] = []
