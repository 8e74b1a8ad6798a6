// Sends Logjam producer messages with the npm `zeromq` package (v6), as a
// DEALER (requests: waits for each reply, as logjam agents do) or a PUSH
// (async data, no reply). Used by tests/interop/test_logjam_zmq.py.
//
//   node logjam_send.mjs --socket dealer|push --endpoint tcp://127.0.0.1:9604
//        [--server-key Z85 --public-key Z85 --secret-key Z85]   (CURVE)
//        [--app-env shop-production] [--topic logs.shop.production]
//        [--count N] [--compression none|zlib|gzip] [--run ID] [--ping]
//        [--timeout-ms MS]
//
// stdout: one JSON line per reply, {"seq": i, "reply": ["shop-production", "202 Accepted"]}
// (the ping's reply has "seq": "ping"). Exit 0 when every request got a 2xx
// reply (PUSH: once every message is queued and the socket has lingered),
// 1 on any error or timeout, 64 on a usage error.
import { parseArgs } from "node:util"
import zlib from "node:zlib"
import * as zmq from "zeromq"

const { values: args } = parseArgs({
  options: {
    socket: { type: "string", default: "dealer" },
    endpoint: { type: "string" },
    "server-key": { type: "string" },
    "public-key": { type: "string" },
    "secret-key": { type: "string" },
    "app-env": { type: "string", default: "shop-production" },
    topic: { type: "string", default: "logs.shop.production" },
    count: { type: "string", default: "3" },
    compression: { type: "string", default: "none" },
    run: { type: "string", default: "node" },
    ping: { type: "boolean", default: false },
    "timeout-ms": { type: "string", default: "10000" },
  },
})

if (!args.endpoint || !["dealer", "push"].includes(args.socket)) {
  console.error("usage: logjam_send.mjs --socket dealer|push --endpoint tcp://HOST:PORT ...")
  process.exit(64)
}

const METHODS = { none: 0, zlib: 1, gzip: 1 }
const method = METHODS[args.compression]
if (method === undefined) {
  console.error(`unknown --compression ${args.compression}`)
  process.exit(64)
}
const timeout = Number(args["timeout-ms"])

// The 24-byte meta frame: tag 0xCABD, compression, version 1, device 0,
// created_ms, sequence, all big-endian.
function meta(sequence, compression) {
  const frame = Buffer.alloc(24)
  frame.writeUInt16BE(0xcabd, 0)
  frame.writeUInt8(compression, 2)
  frame.writeUInt8(1, 3)
  frame.writeUInt32BE(0, 4)
  frame.writeBigUInt64BE(BigInt(Date.now()), 8)
  frame.writeBigUInt64BE(BigInt(sequence), 16)
  return frame
}

function body(i) {
  const json = Buffer.from(
    JSON.stringify({ host: "node.interop.invalid", run: args.run, seq: i, msg: `hello ${i} ünïcødé` }),
  )
  if (args.compression === "zlib") return zlib.deflateSync(json)
  if (args.compression === "gzip") return zlib.gzipSync(json)
  return json
}

const options = { linger: 2000, sendTimeout: timeout }
if (args.socket === "dealer") options.receiveTimeout = timeout
if (args["server-key"]) {
  options.curveServerKey = args["server-key"]
  options.curvePublicKey = args["public-key"]
  options.curveSecretKey = args["secret-key"]
}
const socket = args.socket === "dealer" ? new zmq.Dealer(options) : new zmq.Push(options)
socket.connect(args.endpoint)

async function request(frames, seq) {
  await socket.send(["", ...frames])
  const reply = (await socket.receive()).map((frame) => frame.toString("utf8"))
  console.log(JSON.stringify({ seq, reply }))
  // The spec's reply-msg / pong-msg: the request's app-env ("ping" for a ping), then the status.
  if (reply[0] !== frames[0] || !/^2\d\d /.test(reply[1] ?? "")) {
    throw new Error(`unexpected reply ${JSON.stringify(reply)}`)
  }
}

try {
  const count = Number(args.count)
  for (let i = 1; i <= count; i++) {
    const frames = [args["app-env"], args.topic, body(i), meta(i, method)]
    if (args.socket === "dealer") await request(frames, i)
    else await socket.send(frames)
  }
  if (args.ping && args.socket === "dealer") {
    await request(["ping", args["app-env"], "{}", meta(count + 1, 0)], "ping")
  }
  // Exit once the event loop is empty: closing honours the linger, so a PUSH
  // socket's queued messages leave first.
  socket.close()
  process.exitCode = 0
} catch (error) {
  console.error(`logjam_send: ${error.message ?? error}`)
  socket.close()
  process.exitCode = 1
}
