#!/usr/bin/env node
// The reference for bench/forward_bench.py --reference: the FluentServer of npm
// @fluent-org/logger (tests/interop/node; version 1.0.10, build/src/server.js),
// over TLS, acking every chunk (it writes {"ack": chunk} when an option carries
// "chunk"), keeping nothing but a count of the entries in memory.
//
// Called as the appliance is: `node fluent_server.mjs --config FILE`. It reads
// the port from the config's `bind = "127.0.0.1:PORT"`, the certificate from
// ref-cert.pem / ref-key.pem beside the config (made by the bench), prints the
// appliance's ready line ("CA certificate for clients: PATH"), and on SIGTERM
// logs "event=service.stopped rows=N" on stderr and exits.

import {createRequire} from "node:module";
import fs from "node:fs";
import path from "node:path";

const require = createRequire(import.meta.url);
const here = path.dirname(new URL(import.meta.url).pathname);
const {FluentServer} = require(
  path.join(here, "..", "tests", "interop", "node", "node_modules", "@fluent-org", "logger")
);

const configPath = process.argv[process.argv.indexOf("--config") + 1];
const config = fs.readFileSync(configPath, "utf8");
const port = Number(/bind = "127\.0\.0\.1:(\d+)"/.exec(config)[1]);
const dir = path.dirname(configPath);

let rows = 0;
const server = new FluentServer({
  listenOptions: {host: "127.0.0.1", port},
  tlsOptions: {
    cert: fs.readFileSync(path.join(dir, "ref-cert.pem")),
    key: fs.readFileSync(path.join(dir, "ref-key.pem")),
  },
});
server.on("entry", () => {
  rows += 1;
});
await server.listen();
process.stdout.write(`CA certificate for clients: ${path.join(dir, "ref-ca.pem")}\n`);
process.on("SIGTERM", async () => {
  process.stderr.write(`event=service.stopped commits=0 rows=${rows}\n`);
  await server.close();
  process.exit(0);
});
