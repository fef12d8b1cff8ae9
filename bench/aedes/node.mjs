// One Aedes node for bench/aedes_compare.py: `node node.mjs MQTT_PORT [REDIS_PORT]`.
// With REDIS_PORT the node shares mqemitter-redis (the pub/sub hub that makes Aedes nodes one
// cluster) and aedes-persistence-redis with every other node on that redis-server; without it,
// a single in-memory node (the single-broker reference). Prints one JSON line when listening;
// SIGTERM closes it.
import { createServer } from 'node:net'
import { createRequire } from 'node:module'
import { Aedes } from 'aedes'

const require = createRequire(import.meta.url)
const mqttPort = Number(process.argv[2])
const redisPort = process.argv[3] ? Number(process.argv[3]) : 0
const options = {}
if (redisPort) {
  const redis = { host: '127.0.0.1', port: redisPort }
  options.mq = require('mqemitter-redis')(redis)
  options.persistence = require('aedes-persistence-redis')(redis)
}
const aedes = await Aedes.createBroker(options)
const server = createServer(aedes.handle)
server.listen(mqttPort, '127.0.0.1', () => {
  console.log(JSON.stringify({ event: 'listening', port: mqttPort, redis: redisPort || null }))
})
process.on('SIGTERM', () => {
  server.close()
  aedes.close(() => process.exit(0))
})
