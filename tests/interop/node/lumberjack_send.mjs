#!/usr/bin/env node
// Interop sender: drives a Lumberjack server with a real third-party Node.js
// client, npm `lumberjack-client` (v2, compressed J frames, never reads acks)
// or npm `lumberjack-protocol` (v1 over TLS, uncompressed D frames).
//
// Usage:
//   node lumberjack_send.mjs --client lumberjack-client|lumberjack-protocol
//                            --host H --port P --count N
//                            [--ca CA.pem] [--cert C --key K] [--no-tls]
//                            [--batch B] [--window-size W] [--timeout-ms MS]
//                            [--run R]
//
// Record i (0-based) has "seq" i, "@timestamp" 2026-11-22T10:00:00Z + i ms, and
// "run" R when given (a test tells its runs apart by it). lumberjack-client
// sends a Beats-shaped object (@metadata.beat "nodebeat", host.name
// "interop-node", nested values); lumberjack-protocol sends string pairs
// (type "nodelog", host "interop-node", seq as a string: D frames hold strings).
//
// stdout: on success only, one JSON line per event sent, in order:
//         {"seq": i, "client": C, "record": {...the record as given to the client}}
// stderr: diagnostics.
// exit:   0 done, 1 error or timeout, 64 usage error.
//
// What "done" means differs, because the clients differ (docs/lumberjack.md):
//
// * lumberjack-protocol: every event's sequence number is acknowledged (the
//   client's ClientSocket emits "ack" for each `1A` it parses; an ack of any
//   other version makes the client's parser throw, which fails this script).
//   The client announces its window ONCE per connection (`1W` W right after
//   the handshake) and then numbers D frames 1, 2, 3, ... for the whole
//   connection, so the server can only ack whole windows of W: --count must
//   be a multiple of --window-size. Then the TLS socket is ended (the
//   client's own close() forgets the socket without closing it).
//
// * lumberjack-client: the client never reads from its socket, so acks are
//   never seen. The first --batch events are logged before the connection is
//   up: the client queues them and sends them as one window (`2W` B, one `2C`
//   holding `2J` frames numbered 1..B). Every later event is logged once the
//   connection is up and goes out as its own window (`2W` 1, `2C` holding one
//   `2J` numbered 1), several per tick, so windows arrive pipelined. When all
//   are logged the socket is ended and "done" is the end's callback (every
//   byte handed to the kernel). The script then drains and discards what the
//   server sent (the acks the client ignored) only to wait for the server's
//   close, so that the server sees a clean close rather than a reset; the test
//   polls the table.

import {createRequire} from "node:module";
import {parseArgs} from "node:util";
import fs from "node:fs";

const require = createRequire(import.meta.url);

const EXIT_OK = 0;
const EXIT_ERROR = 1;
const EXIT_USAGE = 64;
const CLIENTS = ["lumberjack-client", "lumberjack-protocol"];
const HOSTNAME = "interop-node";

const log = (...args) => console.error("[lumberjack_send.mjs]", ...args);

let finished = false;

function exit(code) {
  process.stdout.write("", () => process.exit(code));
  setTimeout(() => process.exit(code), 1000).unref();
}

function fail(err) {
  if (finished) return;
  finished = true;
  const msg = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
  process.stderr.write(`error: ${msg}\n`, () => process.exit(EXIT_ERROR));
  setTimeout(() => process.exit(EXIT_ERROR), 1000).unref();
}

function usage(msg) {
  process.stderr.write(
    `usage error: ${msg}\n` +
      "usage: node lumberjack_send.mjs --client lumberjack-client|lumberjack-protocol " +
      "--host H --port P --count N [--ca CA.pem] [--cert C --key K] [--no-tls] " +
      "[--batch B] [--window-size W] [--timeout-ms MS] [--run R]\n",
  );
  process.exit(EXIT_USAGE);
}

function intArg(name, value, min, fallback) {
  if (value === undefined) return fallback;
  if (!/^\d+$/.test(String(value))) usage(`--${name} must be an integer`);
  const n = Number(value);
  if (!Number.isSafeInteger(n) || n < min) usage(`--${name} must be >= ${min}`);
  return n;
}

// ---------------------------------------------------------------- arguments
let parsed;
try {
  parsed = parseArgs({
    args: process.argv.slice(2),
    strict: true,
    allowPositionals: false,
    options: {
      client: {type: "string"},
      host: {type: "string"},
      port: {type: "string"},
      count: {type: "string"},
      ca: {type: "string"},
      cert: {type: "string"},
      key: {type: "string"},
      "no-tls": {type: "boolean", default: false},
      batch: {type: "string"},
      "window-size": {type: "string"},
      "timeout-ms": {type: "string"},
      run: {type: "string"},
    },
  }).values;
} catch (e) {
  usage(e.message);
}
for (const req of ["client", "host", "port", "count"]) {
  if (parsed[req] === undefined) usage(`--${req} is required`);
}
if (!CLIENTS.includes(parsed.client)) usage(`unknown --client ${parsed.client}`);
if ((parsed.cert === undefined) !== (parsed.key === undefined)) {
  usage("--cert and --key must be given together");
}
const opts = {
  client: parsed.client,
  host: parsed.host,
  port: intArg("port", parsed.port, 1),
  count: intArg("count", parsed.count, 1),
  tls: !parsed["no-tls"],
  timeoutMs: intArg("timeout-ms", parsed["timeout-ms"], 1, 30000),
  run: parsed.run,
};
opts.batch = Math.min(intArg("batch", parsed.batch, 1, 100), opts.count);
opts.windowSize = intArg("window-size", parsed["window-size"], 1, Math.min(opts.count, 50));
if (opts.port > 65535) usage("--port must be <= 65535");
if (opts.client === "lumberjack-protocol") {
  if (!opts.tls) usage("lumberjack-protocol speaks TLS only");
  if (opts.count % opts.windowSize !== 0) {
    usage("--count must be a multiple of --window-size (the client announces its window once)");
  }
}

const tlsOptions = {host: opts.host, port: opts.port, rejectUnauthorized: true};
try {
  if (parsed.ca !== undefined) tlsOptions.ca = [fs.readFileSync(parsed.ca)];
  if (parsed.cert !== undefined) {
    tlsOptions.cert = fs.readFileSync(parsed.cert);
    tlsOptions.key = fs.readFileSync(parsed.key);
  }
} catch (e) {
  usage(`cannot read TLS file: ${e.message}`);
}

setTimeout(() => fail(new Error(`timed out after ${opts.timeoutMs} ms`)), opts.timeoutMs).unref();

// ------------------------------------------------------------------- events
// One millisecond apart from a fixed instant (JavaScript dates hold ms).
const BASE_MS = Date.UTC(2026, 10, 22, 10, 0, 0, 0);

function recordFor(i) {
  const timestamp = new Date(BASE_MS + i).toISOString();
  const run = opts.run === undefined ? {} : {run: opts.run};
  if (opts.client === "lumberjack-client") {
    // A Beats-shaped JSON event.
    return {
      "@timestamp": timestamp,
      "@metadata": {beat: "nodebeat", type: "_doc"},
      host: {name: HOSTNAME},
      message: `hello ${i} ünïcødé`,
      seq: i,
      nested: {list: [i, "x"], flag: true},
      ...run,
    };
  }
  // D frames carry string pairs only; the client stringifies every value.
  return {
    "@timestamp": timestamp,
    type: "nodelog",
    host: HOSTNAME,
    line: `hello ${i} ünïcødé`,
    seq: String(i),
    ...run,
  };
}

const records = Array.from({length: opts.count}, (_, i) => recordFor(i));

function printSent() {
  const lines = records.map((record, seq) =>
    JSON.stringify({seq, client: opts.client, record}),
  );
  process.stdout.write(lines.join("\n") + "\n");
}

// ------------------------------------------------------- lumberjack-client
function runLumberjackClient() {
  const LumberjackClient = require("lumberjack-client");
  const client = new LumberjackClient(tlsOptions, opts.tls);
  const socket = client.socket;
  // The client reconnects forever on close and only logs errors through
  // `debug`; here an error fails the run and a close is ours to handle.
  socket.removeAllListeners("close");
  socket.on("error", fail);
  socket.on("close", () => {
    if (!finished) fail(new Error("connection closed before every event was written"));
  });
  // Logged before the connection is up: queued, then flushed as one window.
  for (let i = 0; i < opts.batch; i++) client.log(records[i]);
  socket.once(opts.tls ? "secureConnect" : "connect", () => {
    // The client's own connect callback ran first and flushed the queue.
    let next = opts.batch;
    const sendSome = () => {
      // A few windows of one event per tick: several may share a TLS read.
      for (let k = 0; k < 7 && next < opts.count; k++) client.log(records[next++]);
      if (next < opts.count) {
        setImmediate(sendSome);
        return;
      }
      socket.end(() => {
        // Every window is written; the client would never look at the answers.
        printSent();
        finished = true;
        let discarded = 0;
        socket.on("data", chunk => (discarded += chunk.length));
        socket.on("close", () => {
          log(`server closed; discarded ${discarded} bytes the client never read`);
          exit(EXIT_OK);
        });
        setTimeout(() => {
          log(`server still open after ${opts.timeoutMs} ms; leaving`);
          socket.destroy();
          exit(EXIT_OK);
        }, opts.timeoutMs).unref();
        socket.resume();
      });
    };
    sendSome();
  });
}

// ----------------------------------------------------- lumberjack-protocol
function runLumberjackProtocol() {
  const lumberjack = require("lumberjack-protocol");
  const client = lumberjack.client(tlsOptions, {
    windowSize: opts.windowSize,
    maxQueueSize: opts.count + 1,
    reconnect: 3600000,
  });
  const connection = client._socket; // ClientSocket: the one connection
  const acks = [];
  client.on("dropped", count => fail(new Error(`client dropped ${count} events`)));
  client.on("disconnect", err => fail(err ?? new Error("server closed the connection")));
  connection.on("ack", seq => {
    acks.push(seq);
    if (seq !== opts.count || finished) return;
    finished = true;
    log(`acks: ${acks.join(",")}`);
    printSent();
    const tlsSocket = connection._socket;
    client.removeAllListeners("disconnect");
    client.close(); // forgets the socket but does not close it
    tlsSocket.on("close", () => exit(EXIT_OK));
    tlsSocket.end();
    setTimeout(() => exit(EXIT_OK), 5000).unref();
  });
  // Written before the connection is up: queued, then sent one by one.
  for (const record of records) client.writeDataFrame(record);
}

if (opts.client === "lumberjack-client") runLumberjackClient();
else runLumberjackProtocol();
