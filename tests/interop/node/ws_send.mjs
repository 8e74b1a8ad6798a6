// Sends one ingest message and one invalid message to the appliance's WebSocket
// listener with npm `ws`, printing each answer as a JSON line.
// usage: node ws_send.mjs URL CA_FILE ORIGIN ID EVENTS   (token in $APPLIANCE_TOKEN)
import { readFileSync } from "node:fs";
import WebSocket from "ws";

const [url, caFile, origin, id, count] = process.argv.slice(2);
const ws = new WebSocket(url, {
  ca: readFileSync(caFile),
  origin,
  headers: { Authorization: `Bearer ${process.env.APPLIANCE_TOKEN}` },
  handshakeTimeout: 30000,
});
const answers = [];
const timer = setTimeout(() => {
  console.error("no answers within 30 s");
  process.exit(2);
}, 30000);

ws.on("open", () => {
  const events = [];
  for (let i = 0; i < Number(count); i++) {
    events.push({ time: new Date().toISOString(), record: { i, from: "node ws" } });
  }
  ws.send(JSON.stringify({ id, tag: "web.node", events }));
  ws.send("{");
});
ws.on("message", (data) => {
  answers.push(data.toString());
  console.log(data.toString());
  if (answers.length === 2) {
    clearTimeout(timer);
    ws.close(1000);
  }
});
ws.on("unexpected-response", (req, res) => {
  console.error(`refused: ${res.statusCode}`);
  process.exit(1);
});
ws.on("error", (err) => {
  console.error(String(err));
  process.exit(1);
});
