"""RabbitMQ's stream protocol (port 5552): its connections, sans-IO, over the broker's streams."""
