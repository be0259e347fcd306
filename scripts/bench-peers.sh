#!/usr/bin/env bash
# bench-peers.sh: the claim benchmark's job count and worker counts through two PostgreSQL job
# queues people actually use — graphile-worker 0.16.x and pg-boss 10.x — beside ours
# (`ting-chaos bench claim`), on the same PostgreSQL in the same run. Jobs do nothing.
#
# Each peer runs in its documented fast path: graphile-worker with `concurrency` = workers (it
# fetches one job per round trip; 0.16 has no batched fetch) and bulk enqueue via add_jobs();
# pg-boss with `batchSize` = 100 (batched fetch and batched completion), bulk enqueue via
# insert(), measured twice: its `work()` loop (one per worker; it sleeps pollingIntervalSeconds,
# at least 0.5 s, after every fetch, so that is its ceiling) and a tight fetch()/complete() loop
# per worker (its SQL's own capacity). The queue is filled first, then the clock runs until
# every job has been handled. Their packages are installed into a temporary directory from the
# npm registry at run time and removed afterwards; none of their code is ever committed.
#
# Usage: scripts/bench-peers.sh [JOBS] [WORKERS]      (defaults: 20000 and 1,2,4,8,16,32)
# Env:   DATABASE_URL (a server to use; default: `ting-chaos db up` in the background),
#        TING_CHAOS (the binary; default target/release/ting-chaos).
# Needs: Node 20+ and npm.
set -euo pipefail

JOBS="${1:-20000}"
WORKERS="${2:-1,2,4,8,16,32}"
BIN="${TING_CHAOS:-target/release/ting-chaos}"
PEERS_BATCH=100

tmp="$(mktemp -d)"
db_pid=""
cleanup() {
  if [ -n "$db_pid" ]; then kill -INT "$db_pid" 2>/dev/null || true; wait "$db_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

[ -x "$BIN" ] || { echo "error: $BIN not found; build it with cargo build --release" >&2; exit 2; }
command -v node >/dev/null && command -v npm >/dev/null || { echo "error: node and npm are needed" >&2; exit 2; }

URL="${DATABASE_URL:-}"
if [ -z "$URL" ]; then
  mkfifo "$tmp/db.out"
  "$BIN" db up >"$tmp/db.out" 2>"$tmp/db.err" &
  db_pid=$!
  read -r URL <"$tmp/db.out" || { cat "$tmp/db.err" >&2; exit 3; }
  # Keep draining its stdout so it never blocks on a full pipe.
  cat "$tmp/db.out" >/dev/null &
fi

echo "== bench-peers: $JOBS jobs, workers $WORKERS; node $(node --version); $(nproc) cores; load $(cut -d' ' -f1 /proc/loadavg)"
(cd "$tmp" && npm init -y >/dev/null && npm install --silent --no-audit --no-fund \
  graphile-worker@0.16 pg-boss@10 pg@8 >/dev/null)
echo "   graphile-worker $(node -p "require('$tmp/node_modules/graphile-worker/package.json').version"), pg-boss $(node -p "require('$tmp/node_modules/pg-boss/package.json').version")"

cat >"$tmp/peers.mjs" <<'JS'
// One peer, every worker count: fresh database, fill the queue, time the drain.
import pg from "pg";
const [peer, adminUrl, jobsArg, workersArg, batchArg, mode] = process.argv.slice(2);
const jobs = Number(jobsArg), batch = Number(batchArg);
const withDb = (url, db) => { const u = new URL(url); u.pathname = "/" + db; return u.toString(); };

async function freshDb() {
  const name = `peers_${peer.replace(/-/g, "_")}_${Date.now()}`;
  const c = new pg.Client({ connectionString: adminUrl }); await c.connect();
  await c.query(`CREATE DATABASE ${name}`); await c.end();
  return { name, url: withDb(adminUrl, name) };
}
async function dropDb(name) {
  const c = new pg.Client({ connectionString: adminUrl }); await c.connect();
  await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`); await c.end();
}

async function graphile(url, workers) {
  const { run, runMigrations } = await import("graphile-worker");
  await runMigrations({ connectionString: url });
  const c = new pg.Client({ connectionString: url }); await c.connect();
  await c.query("TRUNCATE graphile_worker._private_jobs CASCADE");
  await c.query(`SELECT count(*) FROM graphile_worker.add_jobs(ARRAY(
      SELECT ROW('noop', '{}'::json, NULL, NULL, NULL, NULL, NULL, NULL)::graphile_worker.job_spec
      FROM generate_series(1, $1)))`, [jobs]);
  await c.end();
  let done = 0, finish;
  const drained = new Promise((r) => (finish = r));
  const t0 = process.hrtime.bigint();
  const pool = new pg.Pool({ connectionString: url, max: workers + 2 });
  pool.on("error", () => {}); // idle clients killed when the database is dropped
  const runner = await run({
    pgPool: pool, concurrency: workers,
    noHandleSignals: true, pollInterval: 100, logger: quietLogger(),
    taskList: { noop: async () => { if (++done === jobs) finish(); } },
  });
  await drained;
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  await runner.stop();
  await pool.end();
  return jobs / secs;
}

async function pgboss(url, workers, mode) {
  const { default: PgBoss } = await import("pg-boss");
  const boss = new PgBoss({ connectionString: url, max: workers + 2,
    supervise: false, schedule: false, migrate: true });
  boss.on("error", (e) => console.error("pg-boss:", e.message));
  await boss.start();
  const queue = `noop_${workers}`;
  await boss.createQueue(queue);
  for (let i = 0; i < jobs; i += 5000) {
    const n = Math.min(5000, jobs - i);
    await boss.insert(Array.from({ length: n }, () => ({ name: queue, data: {} })));
  }
  let done = 0, finish;
  const drained = new Promise((r) => (finish = r));
  const t0 = process.hrtime.bigint();
  if (mode === "work") {
    for (let w = 0; w < workers; w++) {
      await boss.work(queue, { batchSize: batch, pollingIntervalSeconds: 0.5 }, async (js) => {
        done += js.length; if (done >= jobs) finish();
      });
    }
  } else {
    // fetch() + complete() in a tight loop per worker: pg-boss's own SQL, no polling sleep.
    const loop = async () => {
      while (done < jobs) {
        const js = await boss.fetch(queue, { batchSize: batch });
        if (js.length === 0) continue;
        await boss.complete(queue, js.map((j) => j.id));
        done += js.length;
      }
      finish();
    };
    for (let w = 0; w < workers; w++) loop();
  }
  await drained;
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  await Promise.race([boss.stop({ graceful: false, wait: true }), new Promise((r) => setTimeout(r, 5000))]);
  return jobs / secs;
}

function quietLogger() {
  const fn = () => () => {};
  return { scope: () => quietLogger(), debug() {}, info() {}, warn() {}, error: (m) => console.error(m), _logFactory: fn };
}

const out = {};
for (const w of workersArg.split(",").map(Number)) {
  const db = await freshDb();
  try {
    out[w] = peer === "graphile-worker" ? await graphile(db.url, w) : await pgboss(db.url, w, mode);
    console.error(`   ${peer} ${mode ?? ""} workers ${w}: ${out[w].toFixed(0)} jobs/s`);
  } finally { await dropDb(db.name); }
}
console.log(JSON.stringify(out));
// Their timers and pools may outlive stop(); the figures are out, so leave now.
process.exit(0);
JS

cd_node() { (cd "$tmp" && node "$@"); }
echo "-- graphile-worker (concurrency = workers, one job per fetch)"
gw="$(cd_node peers.mjs graphile-worker "$URL" "$JOBS" "$WORKERS" 1)"
echo "-- pg-boss work(): one loop per worker, batchSize $PEERS_BATCH (it sleeps pollingIntervalSeconds, min 0.5 s, between fetches)"
pbw="$(cd_node peers.mjs pg-boss "$URL" "$JOBS" "$WORKERS" "$PEERS_BATCH" work)"
echo "-- pg-boss fetch()+complete(): one tight loop per worker, batchSize $PEERS_BATCH (no polling sleep)"
pb="$(cd_node peers.mjs pg-boss "$URL" "$JOBS" "$WORKERS" "$PEERS_BATCH" fetch)"
echo "-- ting-chaos bench claim (batch 1 and $PEERS_BATCH, beside pgbench)"
"$BIN" bench claim --workers "$WORKERS" --batch "1,$PEERS_BATCH" --rows "$JOBS" \
  --database-url "$URL" --report-dir "$tmp/ours" | tee "$tmp/ours.txt"
ours_json="$(ls "$tmp"/ours/*/bench.json)"

echo
echo "== jobs/s by worker count (same PostgreSQL, same run; $JOBS jobs each)"
node - "$ours_json" "$gw" "$pb" "$PEERS_BATCH" "$pbw" <<'JS'
const fs = require("fs");
const [file, gwj, pbj, b, pbwj] = process.argv.slice(2);
const ours = JSON.parse(fs.readFileSync(file, "utf8")).rows;
const gw = JSON.parse(gwj), pb = JSON.parse(pbj), pbw = JSON.parse(pbwj);
const get = (w, batch) => ours.find((r) => r.workers === w && r.batch === batch)?.stack ?? NaN;
const f = (v) => (Number.isFinite(v) ? v.toFixed(0) : "-").padStart(14);
console.log("workers".padStart(7) + "ours b1".padStart(14) + "graphile-w.".padStart(14) + "b1/gw".padStart(8)
  + `ours b${b}`.padStart(14) + `boss fetch b${b}`.padStart(16) + "b/boss".padStart(8) + `boss work()`.padStart(13));
for (const w of Object.keys(gw).map(Number)) {
  const o1 = get(w, 1), ob = get(w, Number(b));
  console.log(String(w).padStart(7) + f(o1) + f(gw[w]) + ((o1 / gw[w]).toFixed(1) + "x").padStart(8)
    + f(ob) + f(pb[w]).padStart(16) + ((ob / pb[w]).toFixed(1) + "x").padStart(8) + f(pbw[w]).padStart(13));
}
JS
