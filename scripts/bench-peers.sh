#!/usr/bin/env bash
# bench-peers.sh: the claim benchmark's job count and worker counts through two PostgreSQL job
# queues people actually use — graphile-worker 0.16.x and pg-boss 10.x — beside ours
# (`ting-chaos bench claim`), on the same PostgreSQL in the same run. Jobs do nothing.
#
# Each peer runs in its documented fast path: graphile-worker with `concurrency` = workers and
# bulk enqueue via add_jobs(), twice: its default (one job per fetch round trip, one completion
# statement per job) and its 0.16 batched mode (`preset.worker.localQueue.size` = 100: one fetch
# round trip per 100 jobs; `completeJobBatchDelay` = 0: completions flushed together);
# pg-boss with `batchSize` = 100 (batched fetch and batched completion), bulk enqueue via
# insert(), measured twice: its `work()` loop (one per worker; it sleeps pollingIntervalSeconds,
# at least 0.5 s, after every fetch, so that is its ceiling) and a tight fetch()/complete() loop
# per worker (its SQL's own capacity). The queue is filled first, then the clock runs until
# every job has been handled. Their packages are installed into a temporary directory from the
# npm registry at run time and removed afterwards; none of their code is ever committed.
#
# Usage: scripts/bench-peers.sh [JOBS] [WORKERS]      (defaults: 20000 and 1,2,4,8,16,32)
# Env:   DATABASE_URL (a server to use; default: `ting-chaos db up` in the background),
#        TING_CHAOS (the binary; default target/release/ting-chaos),
#        REPORT_DIR (where ours and the peers' figures are written; default reports/bench),
#        ROUNDS (rounds of ours and pgbench per point, the median round kept; default 3: one
#        round moves by 10-15 points on a shared 2-core machine).
# Needs: Node 20+ and npm.
set -euo pipefail

JOBS="${1:-20000}"
WORKERS="${2:-1,2,4,8,16,32}"
BIN="${TING_CHAOS:-target/release/ting-chaos}"
REPORT_DIR="${REPORT_DIR:-reports/bench}"
PEERS_BATCH=100
ROUNDS="${ROUNDS:-3}"

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
// Bytes of WAL the server has written so far: the drain's difference, per job, is what one job
// costs the database in writes (the same figure `bench claim` prints for ours).
async function walBytes(url) {
  const c = new pg.Client({ connectionString: url }); await c.connect();
  const r = await c.query("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint::text AS b");
  await c.end();
  return BigInt(r.rows[0].b);
}
const result = (secs, w0, w1) => ({ rate: jobs / secs, wal: Number(w1 - w0) / jobs });
async function dropDb(name) {
  const c = new pg.Client({ connectionString: adminUrl }); await c.connect();
  await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`); await c.end();
}

async function graphile(url, workers, mode) {
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
  const w0 = await walBytes(url);
  const t0 = process.hrtime.bigint();
  const pool = new pg.Pool({ connectionString: url, max: workers + 2 });
  pool.on("error", () => {}); // idle clients killed when the database is dropped
  const preset = mode === "batched"
    ? { worker: { localQueue: { size: batch }, completeJobBatchDelay: 0, failJobBatchDelay: 0 } }
    : undefined;
  const runner = await run({
    pgPool: pool, concurrency: workers, preset,
    noHandleSignals: true, pollInterval: 100, logger: quietLogger(),
    taskList: { noop: async () => { if (++done === jobs) finish(); } },
  });
  await drained;
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  const w1 = await walBytes(url);
  await runner.stop();
  await pool.end();
  return result(secs, w0, w1);
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
  const w0 = await walBytes(url);
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
  const w1 = await walBytes(url);
  await Promise.race([boss.stop({ graceful: false, wait: true }), new Promise((r) => setTimeout(r, 5000))]);
  return result(secs, w0, w1);
}

function quietLogger() {
  const fn = () => () => {};
  return { scope: () => quietLogger(), debug() {}, info() {}, warn() {}, error: (m) => console.error(m), _logFactory: fn };
}

const out = {};
for (const w of workersArg.split(",").map(Number)) {
  const db = await freshDb();
  try {
    out[w] = peer === "graphile-worker" ? await graphile(db.url, w, mode) : await pgboss(db.url, w, mode);
    console.error(`   ${peer} ${mode ?? ""} workers ${w}: ${out[w].rate.toFixed(0)} jobs/s, ${out[w].wal.toFixed(0)} WAL bytes/job`);
  } finally { await dropDb(db.name); }
}
console.log(JSON.stringify(out));
// Their timers and pools may outlive stop(); the figures are out, so leave now.
process.exit(0);
JS

cd_node() { (cd "$tmp" && node "$@"); }
echo "-- graphile-worker default (concurrency = workers, one job per fetch, one completion per job)"
gw="$(cd_node peers.mjs graphile-worker "$URL" "$JOBS" "$WORKERS" 1 direct)"
echo "-- graphile-worker batched (localQueue.size $PEERS_BATCH, completeJobBatchDelay 0)"
gwb="$(cd_node peers.mjs graphile-worker "$URL" "$JOBS" "$WORKERS" "$PEERS_BATCH" batched)"
echo "-- pg-boss work(): one loop per worker, batchSize $PEERS_BATCH (it sleeps pollingIntervalSeconds, min 0.5 s, between fetches)"
pbw="$(cd_node peers.mjs pg-boss "$URL" "$JOBS" "$WORKERS" "$PEERS_BATCH" work)"
echo "-- pg-boss fetch()+complete(): one tight loop per worker, batchSize $PEERS_BATCH (no polling sleep)"
pb="$(cd_node peers.mjs pg-boss "$URL" "$JOBS" "$WORKERS" "$PEERS_BATCH" fetch)"
echo "-- ting-chaos bench claim (batch 1, 10 and $PEERS_BATCH, beside pgbench; median of $ROUNDS rounds)"
"$BIN" bench claim --workers "$WORKERS" --batch "1,10,$PEERS_BATCH" --rows "$JOBS" --rounds "$ROUNDS" \
  --database-url "$URL" --report-dir "$REPORT_DIR" | tee "$tmp/ours.txt"
ours_dir="$(sed -n 's/^results: //p' "$tmp/ours.txt" | tail -n 1)"
[ -n "$ours_dir" ] && [ -f "$ours_dir/bench.json" ] || { echo "error: bench claim wrote no results" >&2; exit 1; }

echo
node - "$ours_dir" "$PEERS_BATCH" "$gw" "$gwb" "$pb" "$pbw" <<'JS' | tee "$ours_dir/peers.txt"
const fs = require("fs");
const [dir, b, ...peers] = process.argv.slice(2);
const [gw, gwb, pb, pbw] = peers.map((j) => JSON.parse(j));
const ours = JSON.parse(fs.readFileSync(`${dir}/bench.json`, "utf8")).rows;
const row = (w, batch) => ours.find((r) => r.workers === w && r.batch === batch);
const rate = (w, batch) => row(w, batch)?.stack ?? NaN;
const wal = (w, batch) => row(w, batch)?.stack_profile?.wal_bytes ?? NaN;
const n = (v) => (Number.isFinite(v) ? v.toFixed(0) : "-");
const x = (a, c) => (Number.isFinite(a / c) ? (a / c).toFixed(1) + "x" : "-");
const cols = [
  ["workers", 7], ["ours b1", 9], ["graphile-w.", 12], ["b1/gw", 7],
  [`ours b${b}`, 10], [`gw localq ${b}`, 14], ["/gw", 6], [`boss fetch ${b}`, 15], ["/boss", 6], ["boss work()", 12],
];
const line = (vals) => vals.map((v, i) => String(v).padStart(cols[i][1])).join("");
console.log(`== jobs/s by worker count (same PostgreSQL, same run; ${ours[0]?.seeded ?? "?"} jobs each)`);
console.log(line(cols.map((c) => c[0])));
for (const w of Object.keys(gw).map(Number)) {
  const o1 = rate(w, 1), ob = rate(w, Number(b));
  console.log(line([w, n(o1), n(gw[w].rate), x(o1, gw[w].rate), n(ob), n(gwb[w].rate), x(ob, gwb[w].rate),
    n(pb[w].rate), x(ob, pb[w].rate), n(pbw[w].rate)]));
}
console.log("== WAL bytes per job (what one job costs the database in writes)");
console.log(line(cols.map((c) => c[0])));
for (const w of Object.keys(gw).map(Number)) {
  console.log(line([w, n(wal(w, 1)), n(gw[w].wal), "", n(wal(w, Number(b))), n(gwb[w].wal), "",
    n(pb[w].wal), "", n(pbw[w].wal)]));
}
fs.writeFileSync(`${dir}/peers.json`, JSON.stringify({ batch: Number(b),
  "graphile-worker": gw, "graphile-worker-local-queue": gwb, "pg-boss-fetch": pb, "pg-boss-work": pbw }, null, 2) + "\n");
JS
echo "results: $ours_dir (bench.json, chart.svg, peers.json, peers.txt)"
