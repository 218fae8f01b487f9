// RabbitMQ's JavaScript stream client (rabbitmq-stream-js-client) against a broker: it sends
// exchange_command_versions once open, then creates a stream, publishes with a named
// publisher (deduplication), reads from the first offset and asks for the stream's stats.
// Prints one JSON line: what it saw. Usage: node stream_client.js PORT STREAM
const rabbit = require("rabbitmq-stream-js-client");

async function main() {
  const [port, stream] = [Number(process.argv[2]), process.argv[3]];
  const client = await rabbit.connect({
    hostname: "127.0.0.1", port, username: "guest", password: "guest", vhost: "/", heartbeat: 0,
  });
  await client.createStream({ stream, arguments: {} });
  const publisher = await client.declarePublisher({ stream, publisherRef: "js-app" });
  const confirmed = [];
  publisher.on("publish_confirm", (err, ids) => { if (err === null) confirmed.push(...ids.map(Number)); });
  for (const n of [1, 2, 3]) await publisher.basicSend(BigInt(n), Buffer.from(`m${n}`));
  await publisher.basicSend(2n, Buffer.from("again"));  // a resend: confirmed, not stored
  await publisher.flush();
  const received = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`only ${received.length} messages`)), 10000);
    client.declareConsumer({ stream, offset: rabbit.Offset.first() }, (message) => {
      received.push(message.content.toString());
      if (received.length === 3) { clearTimeout(timer); resolve(); }
    }).catch(reject);
  });
  const deadline = Date.now() + 5000;
  while (confirmed.length < 4 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
  const sequence = Number(await publisher.getLastPublishingId());
  const stats = await client.streamStatsRequest(stream);
  console.log(JSON.stringify({
    received, confirmed: confirmed.sort(), sequence,
    stats: Object.fromEntries(Object.entries(stats).map(([k, v]) => [k, Number(v)])),
  }));
  await client.close();
}

main().catch((error) => { console.error(String(error && error.stack || error)); process.exit(1); });
