#!/usr/bin/env node
// Interop sender: drives a Fluentd forward-protocol v1 server with a real
// third-party Node.js client (@fluent-org/logger or fluent-logger v3).
//
// Contract (see README.md):
//   node send.mjs --client fluent-org|fluent-logger
//                 --mode message|forward|packed|compressed
//                 --host H --port P --tag T --count N
//                 [--ca CA.pem] [--no-tls] [--shared-key K] [--username U]
//                 [--password PW] [--client-hostname NAME]
//                 [--cert client.pem --key client.key] [--batch B]
//                 [--timeout-ms MS]
//
// stdout: on success only, one JSON line per event (nothing else).
// stderr: diagnostics.
// exit:   0 all events acked, 1 error/timeout, 2 auth/handshake failure,
//         3 mode not supported by client, 64 usage error.

import {createRequire} from "node:module";
import {parseArgs} from "node:util";
import fs from "node:fs";

const require = createRequire(import.meta.url);

const EXIT_OK = 0;
const EXIT_ERROR = 1;
const EXIT_AUTH = 2;
const EXIT_UNSUPPORTED = 3;
const EXIT_USAGE = 64;

const MODES = {
  message: "Message",
  forward: "Forward",
  packed: "PackedForward",
  compressed: "CompressedPackedForward",
};
const CLIENTS = ["fluent-org", "fluent-logger"];

const log = (...args) => console.error("[send.mjs]", ...args);

let finished = false;
// set once every event is acked and we start closing the connection ourselves
let closing = false;

function fail(code, err) {
  if (finished) return;
  finished = true;
  const msg =
    err instanceof Error ? `${err.name}: ${err.message}` : String(err);
  process.stderr.write(`error: ${msg}\n`, () => process.exit(code));
  // In case the write callback never fires.
  setTimeout(() => process.exit(code), 1000).unref();
}

function usage(msg) {
  process.stderr.write(
    `usage error: ${msg}\n` +
      "usage: node send.mjs --client fluent-org|fluent-logger " +
      "--mode message|forward|packed|compressed --host H --port P --tag T " +
      "--count N [--ca CA.pem] [--no-tls] [--shared-key K] [--username U] " +
      "[--password PW] [--client-hostname NAME] [--cert client.pem --key client.key] " +
      "[--batch B] [--timeout-ms MS]\n"
  );
  process.exit(EXIT_USAGE);
}

function parseIntArg(name, value, min) {
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
      mode: {type: "string"},
      host: {type: "string"},
      port: {type: "string"},
      tag: {type: "string"},
      count: {type: "string"},
      ca: {type: "string"},
      "no-tls": {type: "boolean", default: false},
      "shared-key": {type: "string"},
      username: {type: "string"},
      password: {type: "string"},
      "client-hostname": {type: "string"},
      cert: {type: "string"},
      key: {type: "string"},
      batch: {type: "string"},
      "timeout-ms": {type: "string"},
      "no-ack-race-fix": {type: "boolean", default: false},
      help: {type: "boolean", short: "h", default: false},
    },
  }).values;
} catch (e) {
  usage(e.message);
}
if (parsed.help) usage("help requested");
for (const req of ["client", "mode", "host", "port", "tag", "count"]) {
  if (parsed[req] === undefined) usage(`--${req} is required`);
}
if (!CLIENTS.includes(parsed.client)) usage(`unknown --client ${parsed.client}`);
if (!Object.hasOwn(MODES, parsed.mode)) usage(`unknown --mode ${parsed.mode}`);
if ((parsed.cert === undefined) !== (parsed.key === undefined)) {
  usage("--cert and --key must be given together");
}

const opts = {
  client: parsed.client,
  mode: parsed.mode,
  eventMode: MODES[parsed.mode],
  host: parsed.host,
  port: parseIntArg("port", parsed.port, 1),
  tag: parsed.tag,
  count: parseIntArg("count", parsed.count, 1),
  tls: !parsed["no-tls"],
  noAckRaceFix: parsed["no-ack-race-fix"],
  batch: parsed.batch === undefined ? 10 : parseIntArg("batch", parsed.batch, 1),
  timeoutMs:
    parsed["timeout-ms"] === undefined
      ? 20000
      : parseIntArg("timeout-ms", parsed["timeout-ms"], 1),
};
if (opts.port > 65535) usage("--port must be <= 65535");
if (opts.tag.length === 0) usage("--tag must not be empty");

// Security (handshake) is enabled as soon as any security option is given.
const securityEnabled = [
  "shared-key",
  "username",
  "password",
  "client-hostname",
].some(k => parsed[k] !== undefined);
const security = securityEnabled
  ? {
      clientHostname:
        parsed["client-hostname"] ?? `node-${opts.client}.interop.invalid`,
      sharedKey: parsed["shared-key"] ?? "",
      username: parsed.username ?? "",
      password: parsed.password ?? "",
    }
  : null;

let tlsOptions = null;
if (opts.tls) {
  tlsOptions = {servername: "localhost", rejectUnauthorized: true};
  try {
    if (parsed.ca !== undefined) tlsOptions.ca = fs.readFileSync(parsed.ca);
    if (parsed.cert !== undefined) {
      tlsOptions.cert = fs.readFileSync(parsed.cert);
      tlsOptions.key = fs.readFileSync(parsed.key);
    }
  } catch (e) {
    usage(`cannot read TLS file: ${e.message}`);
  }
} else if (parsed.ca !== undefined || parsed.cert !== undefined) {
  log("warning: --ca/--cert/--key ignored with --no-tls");
}

// ------------------------------------------------------------------- events
// time_i = base + i*1001 ns, base = now (whole seconds) + 123456789 ns, so
// every event has a distinct, non-millisecond-aligned nanosecond part.
const NS = 1000000000n;
const baseNs = BigInt(Math.floor(Date.now() / 1000)) * NS + 123456789n;
const events = [];
for (let i = 0; i < opts.count; i++) {
  const timeNs = baseNs + BigInt(i) * 1001n;
  events.push({
    timeNs,
    epoch: Number(timeNs / NS),
    nano: Number(timeNs % NS),
    record: {
      seq: i,
      client: opts.client,
      mode: opts.mode,
      msg: `hello ${i} ünïcødé`,
    },
  });
}

// Both clients support EventTime (msgpack ext type 0), so event_time is
// always true; kept in the output so the receiver side can assert on it.
const EVENT_TIME = true;

function success() {
  if (finished) return;
  finished = true;
  const out = events
    .map(
      ev =>
        JSON.stringify({
          tag: opts.tag,
          time_ns: ev.timeNs.toString(),
          event_time: EVENT_TIME,
          record: ev.record,
        }) + "\n"
    )
    .join("");
  process.stdout.write(out, () => process.exit(EXIT_OK));
}

const timer = setTimeout(() => {
  fail(
    EXIT_ERROR,
    new Error(
      `timeout after ${opts.timeoutMs} ms: ${acked}/${opts.count} events acked`
    )
  );
}, opts.timeoutMs);

let acked = 0;

process.on("uncaughtException", e => fail(EXIT_ERROR, e));
process.on("unhandledRejection", e => fail(EXIT_ERROR, e));

function batches() {
  const out = [];
  for (let s = 0; s < events.length; s += opts.batch) {
    out.push(events.slice(s, s + opts.batch));
  }
  return out;
}

// ------------------------------------------------------- @fluent-org/logger
async function runFluentOrg() {
  const {FluentClient, EventTime, FluentSocketEvent} =
    require("@fluent-org/logger");

  const AUTH_ERRORS = new Set(["AuthError", "SharedKeyMismatchError"]);
  const codeFor = e => (e && AUTH_ERRORS.has(e.name) ? EXIT_AUTH : EXIT_ERROR);

  const client = new FluentClient(null, {
    eventMode: opts.eventMode,
    socket: {
      host: opts.host,
      port: opts.port,
      // -1: no idle timeout (default 3000 ms would idle-close the socket)
      timeout: -1,
      // fail fast instead of reconnecting with backoff; also disables
      // autoconnect, we call connect() ourselves
      disableReconnect: true,
      ...(tlsOptions ? {tls: tlsOptions} : {}),
    },
    ...(security ? {security} : {}),
    // Presence of `ack` enables chunk/ack; default ackTimeout is only 500 ms.
    ack: {ackTimeout: opts.timeoutMs},
    // 0 = flush on the next tick after emit(): every synchronous emit() batch
    // becomes one request (per tag) in Forward/PackedForward modes.
    flushInterval: 0,
  });

  let established = false;
  let authError = null;
  client.socketOn(FluentSocketEvent.ESTABLISHED, () => {
    established = true;
    log("fluent-org: connection established");
  });
  client.socketOn(FluentSocketEvent.ERROR, err => {
    if (finished) return;
    if (codeFor(err) === EXIT_AUTH) authError = err;
    fail(codeFor(err), err);
  });
  client.socketOn(FluentSocketEvent.CLOSE, () => {
    if (finished || closing) return;
    // Grace period: an auth error (PONG false) may still be in flight.
    setTimeout(() => {
      if (authError) return fail(EXIT_AUTH, authError);
      fail(
        EXIT_ERROR,
        new Error(
          `connection closed by server ${
            established ? "before all events were acked" : "during connect/handshake"
          } (${acked}/${opts.count} acked)`
        )
      );
    }, 250);
  });

  const establishedPromise = new Promise(resolve => {
    if (established) resolve();
    client.socketOn(FluentSocketEvent.ESTABLISHED, resolve);
  });
  await client.connect();
  await establishedPromise;

  const promises = [];
  for (const batch of batches()) {
    for (const ev of batch) {
      const p = client
        .emit(opts.tag, ev.record, new EventTime(ev.epoch, ev.nano))
        .then(() => {
          acked += 1;
        });
      p.catch(() => {}); // handled by Promise.all below
      promises.push(p);
    }
    // Written to the socket as one request (Message mode: one per event).
    await client.flush();
  }
  try {
    await Promise.all(promises);
  } catch (e) {
    return fail(codeFor(e), e);
  }
  clearTimeout(timer);
  log(`fluent-org: all ${acked} events acked`);
  closing = true;
  // graceful close (FIN), bounded
  await Promise.race([
    client.disconnect().catch(() => {}),
    new Promise(r => setTimeout(r, 2000)),
  ]);
  success();
}

// --------------------------------------------------------- fluent-logger v3
// fluent-logger 3.4.1 reads every server reply with `socket.once("data")`,
// attached only inside the socket.write() callback (lib/sender.js _doWrite),
// while the socket is already in flowing mode (resume() after the handshake,
// or left flowing by the previous once("data")). A reply that is read before
// that callback runs is emitted with no listener and silently lost, and the
// client then waits for ackResponseTimeout. Seen with TLS + handshake on
// loopback (4 of 80 runs). This shim keeps such chunks and re-emits them as
// soon as a "data" listener is attached. It does not change a single byte on
// the wire; disable with --no-ack-race-fix to observe the raw client.
function installAckRaceFix(sock) {
  const pending = [];
  const origEmit = sock.emit;
  sock.emit = function (event, ...args) {
    if (event === "data" && this.listenerCount("data") === 0) {
      pending.push(Buffer.from(args[0]));
      log(
        `fluent-logger: held ${args[0].length} bytes read before the client ` +
          "attached its data listener (ack race workaround)"
      );
      return false;
    }
    return origEmit.call(this, event, ...args);
  };
  sock.on("newListener", event => {
    if (event !== "data" || pending.length === 0) return;
    // the listener is added right after "newListener" returns
    process.nextTick(() => {
      if (pending.length === 0 || sock.listenerCount("data") === 0) return;
      origEmit.call(sock, "data", Buffer.concat(pending.splice(0)));
    });
  });
}

async function runFluentLogger() {
  const fluentLogger = require("fluent-logger");
  const {EventTime} = fluentLogger;

  // fluent-logger logs "Checking HELO..." etc. through internalLogger
  // (default console -> stdout); send everything to stderr.
  let invalidHelo = false;
  const internalLogger = {
    info: (...a) => log("fluent-logger info:", ...a),
    log: (...a) => log("fluent-logger log:", ...a),
    warn: (...a) => log("fluent-logger warn:", ...a),
    error: (...a) => {
      log("fluent-logger error:", ...a);
      if (String(a[0]).includes("invalid HELO")) {
        invalidHelo = true;
        fail(EXIT_ERROR, new Error(String(a[0])));
      }
    },
  };

  let sender;
  try {
    sender = fluentLogger.createFluentSender(null, {
      host: opts.host,
      port: opts.port,
      tls: !!tlsOptions,
      tlsOptions: tlsOptions || {},
      eventMode: opts.eventMode,
      requireAckResponse: true,
      ackResponseTimeout: opts.timeoutMs,
      // no automatic reconnect (default: reconnect after 10 minutes)
      enableReconnect: false,
      // PackedForward: queue is flushed flushInterval ms after the
      // connection is writable / the previous ack; we emit one batch at a
      // time, so each request carries exactly one batch.
      flushInterval: 5,
      internalLogger,
      ...(security ? {security} : {}),
    });
  } catch (e) {
    if (e && e.name === "ConfigError" && /event mode/i.test(e.message)) {
      return fail(
        EXIT_UNSUPPORTED,
        `mode not supported by client: fluent-logger rejects eventMode ` +
          `"${opts.eventMode}" (${e.message})`
      );
    }
    return fail(EXIT_ERROR, e);
  }

  const seenSockets = new WeakSet();
  sender.on("connect", () => {
    const sock = sender._socket;
    if (!sock || seenSockets.has(sock)) return;
    seenSockets.add(sock);
    if (!opts.noAckRaceFix) installAckRaceFix(sock);
    sock.on("close", () => {
      if (finished || closing) return;
      setTimeout(() => {
        if (invalidHelo) return;
        const phase = sender._status;
        fail(
          EXIT_ERROR,
          new Error(
            `connection closed by server (client status=${phase}, ` +
              `${acked}/${opts.count} acked)`
          )
        );
      }, 250);
    });
  });
  sender.on("error", err => {
    if (finished) return;
    fail(err && err.name === "HandshakeError" ? EXIT_AUTH : EXIT_ERROR, err);
  });

  for (const batch of batches()) {
    await Promise.all(
      batch.map(
        ev =>
          new Promise((resolve, reject) => {
            sender.emit(
              opts.tag,
              ev.record,
              new EventTime(ev.epoch, ev.nano),
              err => {
                if (err) return reject(err);
                acked += 1;
                resolve();
              }
            );
          })
      )
    ).catch(e => {
      fail(
        e && e.name === "HandshakeError" ? EXIT_AUTH : EXIT_ERROR,
        e
      );
      throw e;
    });
  }
  clearTimeout(timer);
  log(`fluent-logger: all ${acked} events acked`);
  closing = true;
  await new Promise(r => sender.end(null, null, r));
  success();
}

(opts.client === "fluent-org" ? runFluentOrg() : runFluentLogger()).catch(
  e => {
    if (!finished) fail(EXIT_ERROR, e);
  }
);
