'use strict';
/*
 * Drives the real pure-JS RocketMQ client `ali-ons@3.12.0` for the
 * compatibility tests; it is not a test double. Same protocol as
 * cpp_client.py: every stdout line is one JSON object; the library's own
 * logging goes to stderr.
 *
 *   node ons_client.js produce --namesrv A --group G --topic T
 *     stdin: {"mode": "sync"|"sharding", "body", "tags", "keys", "props", "shardingKey", "delayLevel"}
 *     ("delayLevel": Message#delayTimeLevel, the DELAY property)
 *     stdout: {"event": "sent", "mode", "body", "status", "msgId", "queueId", "offset"}
 *             or {"event": "error", "body", "error"}
 *     ali-ons has no oneway send, no batch send and no queue-selector callback:
 *     "sharding" sets the __SHARDING_KEY property, which ali-ons maps to a fixed
 *     queue (md5(key) % number of write queues).
 *
 *   node ons_client.js consume --namesrv A --group G --topic T [--expr E]
 *        [--broadcast] [--from-first] [--instance N] [--max-seconds S]
 *        [--sql EXPR]             (a SQL92 subscription: {expressionType: 'SQL92', subString: EXPR})
 *        [--fail-prefix P] [--fail-times N] [--fail-mode retry|throw]
 *          (fail the first N (default 1) deliveries of bodies starting with P: return
 *           ACTION_RETRY, or throw; either way ali-ons sends the message back. But
 *           ali-ons 3.12 consumes %RETRY%<group> through a wrapper handler that drops
 *           the return value: a redelivered message is retried again only by a throw)
 *        [--max-reconsume-times N] (ali-ons' maxReconsumeTimes, sent in CONSUMER_SEND_MSG_BACK)
 *     stdout: {"event": "started"}, {"event": "recv", ...} per message,
 *             {"event": "stopped"} after close() (which persists offsets).
 *     Stops on a "stop" line or EOF on stdin, SIGTERM, or --max-seconds.
 *
 * ali-ons comes from tests/compat/node_modules, where
 * `npm ci --prefix tests/compat` installs the version in package-lock.json;
 * without it the driver exits 2 with one line saying so.
 */
const readline = require('readline');

function loadOns() {
  try {
    return require('ali-ons');
  } catch (err) {
    if (err.code !== 'MODULE_NOT_FOUND' || !String(err.message).includes("'ali-ons'")) throw err;
    process.stderr.write('ali-ons not installed: npm ci --prefix tests/compat\n');
    process.exit(2);
  }
}

function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

function parseArgs(argv) {
  const args = { cmd: argv[0], expr: '*', broadcast: false, fromFirst: false, maxSeconds: 120, instance: null,
    failPrefix: '', failTimes: 1, failMode: 'retry', sql: null };
  for (let i = 1; i < argv.length; i++) {
    const a = argv[i];
    const next = () => argv[++i];
    switch (a) {
      case '--namesrv': args.namesrv = next(); break;
      case '--group': args.group = next(); break;
      case '--topic': args.topic = next(); break;
      case '--expr': args.expr = next(); break;
      case '--broadcast': args.broadcast = true; break;
      case '--from-first': args.fromFirst = true; break;
      case '--instance': args.instance = next(); break;
      case '--max-seconds': args.maxSeconds = Number(next()); break;
      case '--fail-once-prefix':
      case '--fail-prefix': args.failPrefix = next(); break;
      case '--fail-times': args.failTimes = Number(next()); break;
      case '--fail-mode': args.failMode = next(); break;
      case '--sql': args.sql = next(); break;
      case '--max-reconsume-times': args.maxReconsumeTimes = Number(next()); break;
      default: throw new Error(`unknown argument ${a}`);
    }
  }
  if (!args.namesrv || !args.group || !args.topic) throw new Error('--namesrv, --group and --topic are required');
  return args;
}

// The library logs warnings and errors; keep stdout for our JSON lines.
const logger = {
  info() {},
  debug() {},
  warn(...a) { console.error('[ons warn]', ...a); },
  error(...a) { console.error('[ons error]', ...a); },
};

// ali-ons asserts an HTTP client for resolving name servers from an Aliyun
// address server; with nameSrv given it never calls it, so it must not.
const httpclient = {
  async request(url) { throw new Error(`unexpected HTTP request to ${url}: nameSrv is set`); },
};

function common(args) {
  const o = { httpclient, nameSrv: args.namesrv, logger };
  if (args.instance) o.instanceName = args.instance;
  return o;
}

async function produce(args) {
  const { Producer, Message } = loadOns();
  const producer = new Producer(Object.assign(common(args), { producerGroup: args.group }));
  producer.on('error', err => console.error('[producer error]', err && err.message));
  await producer.ready();
  emit({ event: 'started' });
  const rl = readline.createInterface({ input: process.stdin });
  for await (const raw of rl) {
    const line = raw.trim();
    if (!line) continue;
    if (line === 'stop') break;
    const req = JSON.parse(line);
    const mode = req.mode || 'sync';
    try {
      if (mode !== 'sync' && mode !== 'sharding') throw new Error(`ali-ons cannot send in mode ${mode}`);
      const msg = new Message(args.topic, req.tags || null, req.body || '');
      if (req.keys) msg.keys = String(req.keys).split(' ');
      for (const [k, v] of Object.entries(req.props || {})) msg.properties[k] = v;
      if (mode === 'sharding') msg.shardingKey = String(req.shardingKey);
      if (req.delayLevel) msg.delayTimeLevel = Number(req.delayLevel);
      const r = await producer.send(msg);
      emit({ event: 'sent', mode, body: req.body, status: r.sendStatus, msgId: r.msgId,
        queueId: r.messageQueue ? Number(r.messageQueue.queueId) : null, offset: r.queueOffset });
    } catch (err) {
      emit({ event: 'error', mode, body: req.body, error: `${err.name}: ${err.message}` });
    }
  }
  await producer.close();
  emit({ event: 'stopped' });
  process.exit(0);      // ali-ons leaves timers behind that keep node alive
}

async function consume(args) {
  const { Consumer } = loadOns();
  const opts = Object.assign(common(args), {
    consumerGroup: args.group,
    isBroadcast: args.broadcast,
    // one message at a time, per queue in queue order
    parallelConsumeLimit: 1,
  });
  if (args.fromFirst) opts.consumeFromWhere = 'CONSUME_FROM_FIRST_OFFSET';
  if (args.maxReconsumeTimes !== undefined) opts.maxReconsumeTimes = args.maxReconsumeTimes;
  const consumer = new Consumer(opts);
  consumer.on('error', err => console.error('[consumer error]', err && err.message));
  // ali-ons takes a SQL92 expression as {expressionType, subString}: it sends both
  // in the heartbeat's subscriptionData and in every pull (postSubscriptionWhenPull)
  const expr = args.sql !== null ? { expressionType: 'SQL92', subString: args.sql } : args.expr;
  consumer.subscribe(args.topic, expr, async msg => {
    const body = msg.body ? msg.body.toString('utf8') : null;
    const failed = !!args.failPrefix && (body || '').startsWith(args.failPrefix) &&
      (msg.reconsumeTimes || 0) < args.failTimes;
    emit({
      event: 'recv', body, tags: msg.tags || null, topic: msg.topic,
      keys: msg.keys || null, queueId: msg.queueId, queueOffset: Number(msg.queueOffset),
      msgId: msg.msgId, reconsumeTimes: msg.reconsumeTimes, props: msg.properties, failed,
      bornTs: Number(msg.bornTimestamp), storeTs: Number(msg.storeTimestamp), t: Date.now() / 1000,
    });
    // ACTION_RETRY or a throw: ali-ons sends the message back (CONSUMER_SEND_MSG_BACK, delay level 0)
    if (failed && args.failMode === 'throw') throw new Error(`failing ${body} on purpose`);
    if (failed) return Consumer.ACTION_RETRY;
  });
  await consumer.ready();
  emit({ event: 'started' });

  let stopping = false;
  const stop = async () => {
    if (stopping) return;
    stopping = true;
    try {
      await consumer.close();
    } catch (err) {
      console.error('[close error]', err && err.message);
    }
    emit({ event: 'stopped' });
    process.exit(0);
  };
  process.on('SIGTERM', stop);
  setTimeout(stop, args.maxSeconds * 1000).unref();
  const rl = readline.createInterface({ input: process.stdin });
  rl.on('line', l => { if (l.trim() === 'stop') stop(); });
  rl.on('close', stop);
}

(async () => {
  const args = parseArgs(process.argv.slice(2));
  if (args.cmd === 'produce') await produce(args);
  else if (args.cmd === 'consume') await consume(args);
  else throw new Error(`unknown subcommand ${args.cmd}`);
})().catch(err => {
  emit({ event: 'error', error: `${err.name}: ${err.message}`, stack: err.stack });
  process.exit(1);
});
